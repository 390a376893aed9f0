"""What the ``test_reliability_*`` files share: the repository root, two small synthetic configs and two
helpers for warnings and one-line errors."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = {"dataset": "synthetic", "n_clients": 6, "rounds": 2, "batch_size": 16, "seed": 1}
TINY = dict(BASE, rounds=1, n_clients=3, batch_size=32, fraction=0.1, test_samples=100)


class warnings_allowed:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def _one_line_err(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(prefix) and "\n" not in err and "Traceback" not in err, err
    return err
