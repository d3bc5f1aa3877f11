"""The controller's commands without a cluster: clear errors and exit codes."""

from __future__ import annotations


def test_no_cluster_is_exit_2_with_the_reason(run_cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"KUBECONFIG": str(tmp_path / "missing"), "KUBERNETES_SERVICE_HOST": ""}
    for args in (["nodes"], ["release", "gpu-1"], ["controller", "--once"]):
        out = run_cli(*args, env=env)
        assert out.returncode == 2, (args, out.stderr)
        assert "cannot open the kubernetes cluster" in out.stderr


def test_unknown_config_key_is_named(run_cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("controller:\n  safety:\n    max_disrupt: 3\n")
    out = run_cli("controller", "--config", str(cfg), "--once")
    assert out.returncode == 2
    assert "controller.safety.max_disrupt" in out.stderr and "unknown key" in out.stderr


def test_help_stands_on_its_own(run_cli) -> None:  # type: ignore[no-untyped-def]
    out = run_cli("controller", "--help")
    assert out.returncode == 0
    for word in ("--cluster", "--dry-run", "--config", "QUARANTINED", "release"):
        assert word in out.stdout
