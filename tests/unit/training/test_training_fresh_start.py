"""When no checkpoint verifies: the refusal names each damaged one, damaged folders are set
aside (never deleted), and the launcher's own flag is read only before the script."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuvigil.core import exit_codes
from gpuvigil.training import launch, manifest, metrics, resume, run_state
from gpuvigil.training.config import TrainingConfig
from gpuvigil.training.resume import Choice, Skipped
from gpuvigil.training.storage import LocalStorage


def test_no_refusal_when_one_verifies_or_none_was_ever_committed() -> None:
    bad = Skipped("step-000000008", "damaged", "file x fails its SHA-256 check")
    assert resume.refusal(Choice("step-000000004", [bad]), location="/c") == ""
    interrupted = Skipped("step-000000004", "uncommitted", "no manifest")
    assert resume.refusal(Choice(None, [interrupted]), location="/c") == ""
    assert resume.refusal(Choice(None), location="/c") == ""


def test_refusal_names_every_damaged_checkpoint_and_the_way_out() -> None:
    skipped = [
        Skipped("step-000000008", "damaged", "manifest is not JSON"),
        Skipped("step-000000006", "uncommitted", "no manifest"),
        Skipped("step-000000004", "damaged", "file __1_0.distcp is missing"),
    ]
    text = resume.refusal(Choice(None, skipped), location="/ckpt")
    assert "2 checkpoint(s) in /ckpt" in text
    assert "step-000000008: manifest is not JSON" in text
    assert "step-000000004: file __1_0.distcp is missing" in text
    assert "step-000000006" not in text
    assert f"code {exit_codes.NO_VERIFIED_CHECKPOINT}" in text and "--allow-fresh-start" in text


def test_damaged_folders_are_renamed_never_deleted(tmp_path: Path) -> None:
    st = LocalStorage(str(tmp_path))
    for name in ("step-000000004", "step-000000008", "damaged-step-000000008"):
        st.write_atomic(f"{name}/manifest.json", name.encode())
    skipped = [
        Skipped("step-000000008", "damaged", "x"),
        Skipped("step-000000004", "uncommitted", "y"),
    ]
    assert resume.keep_damaged(st, skipped) == ["damaged-step-000000008.2"]
    assert st.read_bytes("damaged-step-000000008.2/manifest.json") == b"step-000000008"
    assert st.read_bytes("damaged-step-000000008/manifest.json") == b"damaged-step-000000008"
    assert st.exists("step-000000004/manifest.json")  # not a damaged one: left alone
    assert not st.exists("step-000000008")


def test_the_launcher_flag_counts_only_before_the_script() -> None:
    argv = ["--standalone", "--allow-fresh-start", "train.py", "--allow-fresh-start", "--x"]
    assert launch.own_flags(argv, script="train.py") == (
        ["--standalone", "train.py", "--allow-fresh-start", "--x"],
        True,
    )
    assert launch.own_flags(["train.py", "--allow-fresh-start"], script="train.py") == (
        ["train.py", "--allow-fresh-start"],
        False,
    )


def test_the_setting_defaults_to_refusing_and_reads_the_launchers_variable() -> None:
    assert TrainingConfig().checkpoint.allow_fresh_start is False
    env = {launch.ALLOW_FRESH_START_ENV: "true"}
    assert TrainingConfig.load(environ=env).checkpoint.allow_fresh_start is True


def _run(root: Path, group: Any, *, fresh: bool) -> Any:
    """What `run_state.load` reads of a `Run`: its storage, group, config and metrics."""
    config = TrainingConfig.model_validate(
        {"checkpoint": {"dir": str(root), "allow_fresh_start": fresh}}
    )
    return SimpleNamespace(
        _ckpt=SimpleNamespace(storage=LocalStorage(str(root))),
        env=SimpleNamespace(rank=0, world_size=1, groups={"checkpoint": group}),
        config=config,
        metrics=metrics.build(CollectorRegistry()),
    )


def _damage(root: Path) -> list[str]:
    """Two checkpoints whose manifests are not JSON (committed, then damaged)."""
    names = ["step-000000004", "step-000000008"]
    for name in names:
        (root / name).mkdir()
        (root / name / manifest.MANIFEST).write_bytes(b'{"files": ')
    return names


def test_every_checkpoint_damaged_raises_91_logs_an_error_and_moves_nothing(
    tmp_path: Path, one_rank: Any, caplog: pytest.LogCaptureFixture
) -> None:
    names = _damage(tmp_path)
    with caplog.at_level(logging.INFO), pytest.raises(resume.NoVerifiedCheckpoint) as got:
        run_state.load(_run(tmp_path, one_rank, fresh=False))
    assert got.value.code == exit_codes.NO_VERIFIED_CHECKPOINT
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    for name in names:  # each folder tried, with why it failed
        assert f"{name}: manifest is not JSON" in error.getMessage()
    # Refused: not even renamed, so a person finds them where the job left them.
    assert sorted(p.name for p in tmp_path.iterdir()) == names


def test_fresh_start_is_explicit_and_keeps_the_damaged_folders(
    tmp_path: Path, one_rank: Any, caplog: pytest.LogCaptureFixture
) -> None:
    names = _damage(tmp_path)
    with caplog.at_level(logging.INFO):
        assert run_state.load(_run(tmp_path, one_rank, fresh=True)) is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"damaged-{n}" for n in names]


def test_no_checkpoint_at_all_is_a_fresh_start_not_an_error(
    tmp_path: Path, one_rank: Any, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "step-000000004").mkdir()  # an interrupted first save: never a checkpoint
    with caplog.at_level(logging.INFO):
        assert run_state.load(_run(tmp_path, one_rank, fresh=False)) is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (tmp_path / "step-000000004").is_dir()
