"""`python -m launcher.sync DIR [--tracking-uri URI]`: upload a run's journal to MLflow.

DIR: the journal folder a run named when it ended with MLflow away (<checkpoint.dir>/tracking,
or .cache/journal/<run>), or a checkpoint dir holding one. Uploads the records MLflow does not
hold yet, in order, then says what the run is now; running it again uploads nothing twice.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.journal import JOURNAL, Journal, JournalError, Uploader, lock_journal


def find_journal(path: Path) -> Path:
    for folder in (path, path / "tracking"):
        if (folder / JOURNAL).is_file():
            return folder
    raise JournalError(f"no {JOURNAL} in {path} or {path / 'tracking'}: pass the folder a run "
                       "named when it ended (python -m launcher.sync DIR)")


def tracking_uri_of(journal: Journal) -> str:
    """The URI the run was logging to: the first record's (create/attach) note in the cursor,
    else the one the trainer used (the config's, $MLFLOW_TRACKING_URI, the repo's sqlite)."""
    cursor = journal.read_cursor()
    if cursor.get("tracking_uri"):
        return cursor["tracking_uri"]
    from launcher.tracking import resolve_tracking_uri

    return resolve_tracking_uri(None)


def sync(path: str | Path, tracking_uri: str | None = None, say=print) -> int:
    """Upload what is pending; -> the number of records uploaded."""
    folder = find_journal(Path(path))
    lock = lock_journal(folder)
    try:
        journal = Journal(folder)
        uri = tracking_uri or tracking_uri_of(journal)
        uploader = Uploader(journal, uri)
        pending = journal.count - uploader.cursor["applied"]
        if not pending:
            say(f"{folder}: MLflow run {uploader.run_id} in {uri} holds all {journal.count} "
                "records; nothing to upload")
            return 0
        try:
            done = uploader.upload()
        except JournalError:
            raise
        except Exception as err:
            left = journal.count - uploader.cursor["applied"]
            raise JournalError(f"MLflow at {uri} failed ({type(err).__name__}: "
                               f"{str(err).splitlines()[0] if str(err) else ''}); {left} records "
                               "are still pending: run this again when it answers") from err
        journal.close()
        run = uploader.client.get_run(uploader.run_id)
        say(f"{folder}: uploaded {done} records to MLflow run {uploader.run_id} "
            f"({run.info.run_name}, {run.info.status}) in {uri}")
        return done
    finally:
        lock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.sync", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="the run's journal folder (or its checkpoint dir)")
    parser.add_argument("--tracking-uri", help="upload there instead of the run's own URI")
    args = parser.parse_args(argv)
    try:
        sync(args.dir, args.tracking_uri)
    except JournalError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
