r"""The `mbrs` package's MBR choices over candidate sets: the check of translate/decoding/mbr.py.

    python -m scripts.compare.mbrs_choose --metric=chrf < candidates.jsonl > choices.jsonl
    python scripts/compare/mbrs_choose.py --metric=chrf ...   # any interpreter that has mbrs

Each input line is a JSON list of one sentence's candidates; each output line is the JSON
{"index": i, "text": ...} of the candidate mbrs's naive MBR decoder (`DecoderMBR`, the
candidates as their own pseudo-references) picks, by sacreBLEU sentence chrF or BLEU at mbrs's
defaults. Needs only mbrs (and its torch), so it runs in an environment of its own: mbrs's
COMET dependency pins numpy < 2, which JAX does not run with (docs/translating.md).
"""

import argparse
import json
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metric", choices=["chrf", "bleu"], default="chrf")
    args = parser.parse_args()
    from mbrs.decoders import DecoderMBR
    from mbrs.metrics import MetricBLEU, MetricChrF

    metric = (
        MetricChrF(MetricChrF.Config(num_workers=1))
        if args.metric == "chrf"
        else MetricBLEU(MetricBLEU.Config(num_workers=1))
    )
    decoder = DecoderMBR(DecoderMBR.Config(), metric)
    for line in sys.stdin:
        candidates = json.loads(line)
        found = decoder.decode(candidates, candidates, nbest=1)
        print(json.dumps({"index": int(found.idx[0]), "text": found.sentence[0]}), flush=True)


if __name__ == "__main__":
    main()
