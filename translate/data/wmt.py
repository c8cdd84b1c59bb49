"""TFDS translation datasets (WMT14 by default) as text pairs, prepared and read without TensorFlow.

A dataset is prepared once as array_record files (`download_and_prepare(file_format=
"array_record")`) and read with random access through `tfds.data_source`; neither needs
TensorFlow. Three parts of TFDS do, and are handled here instead:
- without TensorFlow, TFDS registers no dataset builders, so the builder's module is imported
  by name (`tensorflow_datasets.translate.wmt14`);
- TFDS's archive extractor calls `tf.io.gfile`, so the archives are unpacked here, with Python's
  `tarfile`, into the directory TFDS would have used (`downloads/extracted/TAR_GZ.<archive>`);
  TFDS then finds them and skips its own extraction;
- its downloader falls back on `tf.io.gfile` too, so missing archives are fetched here (checked
  against the sha256 that TFDS registers for them) into `<data dir>/downloads/manual`, where
  TFDS looks for archives that were fetched by hand.

Offline, put the archives in that manual directory yourself; without them, preparing fails at
once with the list of URLs.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import logging
import os
import pathlib
import re
import shutil
import socket
import tarfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Sequence

from translate import atomic
from translate.data.text import ParallelText

log = logging.getLogger("translate")


def resolve_data_dir(tfds_data_dir: str) -> pathlib.Path:
    """The TFDS data root: the config field, else $TFDS_DATA_DIR, else TFDS's default."""
    if tfds_data_dir:
        return pathlib.Path(tfds_data_dir).expanduser()
    if os.environ.get("TFDS_DATA_DIR"):
        return pathlib.Path(os.environ["TFDS_DATA_DIR"]).expanduser()
    return pathlib.Path("~/tensorflow_datasets").expanduser()


def import_builder_module(name: str) -> None:
    """Registers the builder of `name` ("wmt14_translate/de-en"), which TFDS skips without TF."""
    dataset = name.split("/")[0].split(":")[0]
    match = re.fullmatch(r"(wmt\d\d)_translate", dataset)
    try:
        importlib.import_module(f"tensorflow_datasets.translate.{match[1] if match else dataset}")
    except ModuleNotFoundError:
        pass  # not a translation builder shipped with TFDS; tfds.builder names the problem


def network_reachable(urls: Sequence[str], timeout: float = 3.0) -> bool:
    """Whether a TCP connection opens to every host of `urls` within `timeout` seconds.

    With a proxy configured the hosts are not probed directly; the download is left to try.
    """
    if any(os.environ.get(v) for v in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy")):
        return True
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=timeout).close()
        except OSError:
            return False
    return True


def required_archives(builder) -> dict[str, str]:
    """URL -> archive file name of everything the builder's download step would fetch."""
    urls: list[str] = []
    if hasattr(builder, "subsets"):  # a WMT builder fetches only its language pair's subsets
        from tensorflow_datasets.translate import wmt

        source = builder.builder_config.language_pair[0]
        for names in builder.subsets.values():
            for name in names:
                dataset = wmt.DATASET_MAP[name]
                if not dataset.get_manual_dl_files(source):  # TFDS asks for those by name
                    urls += dataset.get_url(source)
    infos = builder.url_infos or {}
    urls = urls or list(infos)
    return {
        url: infos[url].filename if url in infos and infos[url].filename else url.split("/")[-1]
        for url in dict.fromkeys(urls)
    }


def fetch_archives(builder, manual_dir: pathlib.Path) -> None:
    """Downloads the archives missing from `manual_dir`, or raises at once when offline.

    Raises:
      FileNotFoundError: some archive is missing and its host cannot be reached; the message
        lists the URLs and where to put the files.
    """
    missing = {
        url: name
        for url, name in required_archives(builder).items()
        if not (manual_dir / name).is_file()
    }
    if not missing:
        return
    if not network_reachable(list(missing)):
        listing = "\n".join(f"  {url}  ->  {manual_dir / name}" for url, name in missing.items())
        root = builder.data_dir_root
        raise FileNotFoundError(
            f"{builder.info.full_name} is not prepared in {root} and the network is "
            f"unreachable. Download these archives on a machine with network access and put "
            f"them in {manual_dir}:\n{listing}\nor copy an already prepared {builder.name}/ "
            f"directory into {root} (--config.data.tfds_data_dir or $TFDS_DATA_DIR choose "
            "another root)."
        )
    manual_dir.mkdir(parents=True, exist_ok=True)
    infos = builder.url_infos or {}
    for url, name in missing.items():
        log.info("downloading %s to %s", url, manual_dir)
        digest = hashlib.sha256()
        with atomic.AtomicFile(manual_dir / name, fsync=False) as f:
            with urllib.request.urlopen(url, timeout=60) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
                    f.write(block)
            expected = infos[url].checksum if url in infos else None
            if expected and digest.hexdigest() != expected:
                raise OSError(f"{url}: sha256 {digest.hexdigest()}, TFDS expects {expected}")
            f.commit()


def extract_archives(builder, downloads: pathlib.Path) -> None:
    """Unpacks each archive of `downloads/manual` where TFDS's own (TF-based) extractor would."""
    from tensorflow_datasets.core.download import resource

    method = resource.ExtractMethod
    for name in required_archives(builder).values():
        archive = downloads / "manual" / name
        kind = resource.guess_extract_method(name)
        target = downloads / "extracted" / f"{kind.name}.{name}"
        if kind == method.NO_EXTRACT or target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind in (method.TAR, method.TAR_GZ, method.TAR_STREAM, method.TAR_GZ_STREAM):
            with atomic.directory(target) as tmp, tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
        elif kind == method.ZIP:
            with atomic.directory(target) as tmp, zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:  # GZIP: one compressed file, which TFDS extracts to a file of the target's name
            with (
                atomic.file(target) as tmp,
                gzip.open(archive, "rb") as src,
                open(tmp, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst)


def prepare(name: str, data_dir: pathlib.Path):
    """Returns the builder of `name`, first preparing it as array_record under `data_dir`.

    Args:
      name: TFDS "dataset/config", e.g. "wmt14_translate/de-en".
      data_dir: TFDS data root; archives in `data_dir/downloads/manual` replace downloads.
    """
    import tensorflow_datasets as tfds

    import_builder_module(name)
    builder = tfds.builder(name, data_dir=os.fspath(data_dir), file_format="array_record")
    if not builder.is_prepared():
        downloads = data_dir / "downloads"
        fetch_archives(builder, downloads / "manual")
        extract_archives(builder, downloads)
        log.info("preparing %s as array_record in %s", builder.info.full_name, data_dir)
        builder.download_and_prepare(
            file_format="array_record",
            download_config=tfds.download.DownloadConfig(manual_dir=downloads / "manual"),
        )
    return builder


def to_text(text: bytes | str) -> str:
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def open_split(
    builder, split: str, src_lang: str, tgt_lang: str, data_dir: pathlib.Path
) -> ParallelText:
    """One split as `ParallelText`, read by index through `tfds.data_source`."""
    import tensorflow_datasets as tfds

    languages = tuple(builder.info.supervised_keys or ())
    if {src_lang, tgt_lang} - set(languages):
        raise ValueError(
            f"data.src_lang={src_lang!r}, data.tgt_lang={tgt_lang!r}: "
            f"{builder.info.full_name} holds the languages {languages}"
        )
    name, version = builder.info.full_name.rsplit("/", 1)
    source = tfds.data_source(
        f"{name}:{version}", split=split, data_dir=os.fspath(data_dir), download=False
    )

    def read(indices: Sequence[int]) -> tuple[list[str], list[str]]:
        # One batched read: about 20x faster than reading record by record.
        examples = source.__getitems__(list(indices))
        return [to_text(e[src_lang]) for e in examples], [to_text(e[tgt_lang]) for e in examples]

    identity = f"tfds:{builder.info.full_name}:{split}:{len(source)}:{src_lang}->{tgt_lang}"
    return ParallelText(len(source), read, identity)


def read_split(
    builder, split: str, src_lang: str, tgt_lang: str, data_dir: pathlib.Path
) -> tuple[list[str], list[str]]:
    """A whole (small) split as raw (sources, references), exactly as TFDS stores them."""
    text = open_split(builder, split, src_lang, tgt_lang, data_dir)
    return text.read(range(text.num_pairs))
