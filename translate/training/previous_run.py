"""`--force`'s earlier run: set aside in previous_run/ until the new run's data has loaded, then
deleted, or put back when the data fails, a stop signal abandons it, or the process was killed
meanwhile (found at the next start).
"""

from __future__ import annotations

import logging
import shutil

import jax

from translate.workdir import Workdir

log = logging.getLogger("translate")


def recover_previous_run(workdir: Workdir) -> str | None:
    """Finishes what a `--force` run that was killed left behind (process 0).

    previous_run/ at a run's start means the --force run died before its data had loaded: the
    earlier run is put back. `.previous_run.deleting/` means it died after: that is deleted.

    Returns:
      What was put back, for the log, or None.
    """
    if jax.process_index() != 0:
        return None
    if workdir.discarded_run.exists():
        shutil.rmtree(workdir.discarded_run)
    if not workdir.previous_run.is_dir():
        return None
    names = sorted(p.name for p in workdir.previous_run.iterdir())
    settle_previous_run(workdir, keep=True)
    return ", ".join(names)


def settle_previous_run(workdir: Workdir, keep: bool) -> None:
    """Deletes the run that `--force` set aside, or with `keep` puts it back (process 0).

    Putting it back first removes what the new run had generated in its place. Deleting it
    first puts evaluations/ back: translate-evaluate's reports are the user's, never deleted.
    """
    if jax.process_index() != 0 or not workdir.previous_run.is_dir():
        return
    if keep:
        for old in workdir.previous_run.iterdir():
            new = workdir.path / old.name
            if new.is_dir() and not new.is_symlink():
                shutil.rmtree(new)
            elif new.exists() or new.is_symlink():
                new.unlink()
            old.rename(new)
        workdir.previous_run.rmdir()
    else:
        kept = workdir.previous_run / workdir.evaluations.name
        if kept.is_dir() and not workdir.evaluations.exists():  # the user's: never deleted
            kept.rename(workdir.evaluations)
        log.info("--force: %s", deleted_earlier_run(workdir))
        # One rename commits the deletion: a run killed during rmtree leaves a directory that
        # the next start deletes, never a half-deleted run that it would put back.
        workdir.previous_run.rename(workdir.discarded_run)
        shutil.rmtree(workdir.discarded_run)


def deleted_earlier_run(workdir: Workdir) -> str:
    """What `--force` deletes of the earlier run set aside in previous_run/, and what it keeps
    beside it (the user's: translate-evaluate's evaluations by number, the user's files), for
    the log."""
    aside = workdir.previous_run
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in aside.iterdir())
    line = f"deleted the earlier run in {workdir.path}: {', '.join(names)}"
    kept = [
        p
        for p in sorted(workdir.path.iterdir())
        if not workdir.owns(p) and not p.name.startswith(".")
    ]
    if kept:
        said = []
        for p in kept:
            if p == workdir.evaluations and p.is_dir():
                n = len(list(p.iterdir()))
                said.append(f"evaluations/ ({n} evaluation{'' if n == 1 else 's'} of that model)")
            else:
                said.append(p.name + ("/" if p.is_dir() else ""))
        line += f"; kept what is not the run's: {', '.join(said)}"
    return line
