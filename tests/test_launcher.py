"""fedowen_deploy.launcher.flwr_run reads a run's final status from ``flwr list`` (a fake
``flwr``).

``flwr run`` exits 0 even when the run failed, so the status must come from ``flwr list``.
The fake ``flwr`` executable answers ``run`` as Flower does (the run id in its output) and
``list`` with the statuses given, one per call, so polling and failure are checked without a
SuperLink (the real ``flwr run`` paths are the e2e tests in test_e2e_flwr_run.py).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import fedowen_deploy.launcher
from fedowen_deploy.launcher import flwr_run

RUN_ID = 1859953118041441032
FAKE_FLWR = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).parent
if sys.argv[1] == "run":
    print({run_line!r}, flush=True)
elif sys.argv[1] == "list":
    calls = here / "list-calls"
    n = int(calls.read_text()) if calls.exists() else 0
    calls.write_text(str(n + 1))
    statuses = json.loads((here / "statuses.json").read_text())
    run = {{"run-id": int(sys.argv[sys.argv.index("--run-id") + 1]),
           "status": statuses[min(n, len(statuses) - 1)]}}
    print(json.dumps({{"success": True, "runs": [run]}}))
"""


@dataclass
class Link:
    flwr_home: Path
    name: str = "fake"


def fake_flwr(bin_dir: Path, statuses: list[str], run_line: str) -> Path:
    bin_dir.mkdir()
    (bin_dir.parent / "home").mkdir(exist_ok=True)  # the Link's FLWR_HOME
    script = bin_dir / "flwr"
    script.write_text(FAKE_FLWR.format(python=sys.executable, run_line=run_line))
    script.chmod(0o755)
    (bin_dir / "statuses.json").write_text(json.dumps(statuses))
    return bin_dir


def test_a_run_that_fails_at_once_is_reported_failed(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: flwr run "succeeds" (exit 0, a run id), flwr list says the run failed
    bin_dir = fake_flwr(tmp_path / "bin", ["starting", "finished:failed"],
                        f"Successfully started run {RUN_ID}")
    monkeypatch.setattr(fedowen_deploy.launcher, "BIN", bin_dir)
    # Execute
    outcome = flwr_run(Link(tmp_path / "home"), {"num-server-rounds": 1}, num_supernodes=2,
                       timeout=30)
    # Assert: the status was polled past "starting" and the failure is not an ok outcome
    assert outcome.run_id == RUN_ID
    assert outcome.status == "finished:failed" and not outcome.ok
    assert (bin_dir / "list-calls").read_text() == "2"


def test_a_completed_run_is_ok_and_an_unsubmitted_one_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    done = fake_flwr(tmp_path / "done", ["running", "running", "finished:completed"],
                     f"run ID: {RUN_ID}")
    refused = fake_flwr(tmp_path / "refused", ["finished:completed"],
                        "[code: 15] Invalid run configuration.")
    # Execute
    monkeypatch.setattr(fedowen_deploy.launcher, "BIN", done)
    completed = flwr_run(Link(tmp_path / "home"), {}, num_supernodes=2, timeout=30)
    monkeypatch.setattr(fedowen_deploy.launcher, "BIN", refused)
    unsubmitted = flwr_run(Link(tmp_path / "home"), {}, num_supernodes=2, timeout=30)
    # Assert
    assert completed.ok and completed.status == "finished:completed"
    assert (done / "list-calls").read_text() == "3"
    assert unsubmitted.status == "not-submitted" and unsubmitted.run_id is None
    assert not unsubmitted.ok and "Invalid run configuration" in unsubmitted.output
    assert not (refused / "list-calls").exists()  # no run id: flwr list is never asked


def test_resume_hint_repeats_the_arguments_with_resume_from(tmp_path: Path) -> None:
    from fedowen_deploy.cli import resume_hint

    out = tmp_path / "run dir"
    argv = ["--rounds", "100", "--output-dir", str(out), "--set", "alpha=0.01",
            "--set", "resume-from=/old"]
    assert "nothing to resume" in resume_hint(argv, str(out))  # no round completed yet
    out.mkdir()
    (out / "checkpoint.npz").write_bytes(b"")
    hint = resume_hint(argv, str(out))
    assert hint == ("interrupted; resume with: bash scripts/run.sh --rounds 100 --set "
                    f"alpha=0.01 --set 'resume-from={out}'")


@pytest.mark.parametrize(("args", "said"), [
    (["--data-dir", "/nonexistent/data"],
     "data-dir=/nonexistent/data: Dataset 'mnist' not found: searched /nonexistent/data"),
    (["--set", "alpah=0.5"], "unknown key 'alpah' (did you mean 'alpha'?)"),
    (["--set", "model=tests.user_models:wrong_classes"],
     "model='tests.user_models:wrong_classes' returned [2, 3] for 2 inputs"),
    (["--dataset", "medmnist"],  # BreastMNIST's 546 images cannot make 100 partitions of 10
     "dataset=medmnist: the clients' pool keeps 398 of 546 training samples"),
])
def test_run_sh_fails_before_any_superlink_naming_the_problem(
        args: list[str], said: str, shared_data_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fedowen_deploy.cli import main

    argv = ["--rounds", "1", "--output-dir", str(tmp_path / "out"),
            "--flwr-home", str(tmp_path / "home"), *args]
    if "--data-dir" not in args:
        argv += ["--data-dir", str(shared_data_dir)]
    # Execute
    code = main(argv)
    # Assert: exit 2, the reason in the last line, and no SuperLink ever started
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and said in last, last
    assert not (tmp_path / "home").exists()


def test_an_early_unknown_status_is_asked_again_and_a_lasting_one_is_the_answer() -> None:
    from fedowen_deploy.launcher import final_status

    answers = iter(["unknown", "unknown", "running", "finished:completed"])
    assert final_status(lambda: next(answers), time.monotonic() + 60, sleep=lambda s: None) \
        == "finished:completed"
    # an unknown that lasts past the grace is the answer (the loop ends)
    assert final_status(lambda: "unknown", time.monotonic() + 60, grace=0.05,
                        sleep=time.sleep) == "unknown"
