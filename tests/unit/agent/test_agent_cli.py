"""`gpuvigil agent` flags -> config overrides (the flags win over the file)."""

from __future__ import annotations

from pathlib import Path

from gpuvigil import config as gconfig
from gpuvigil.commands.agent import SinkName, overrides_from_flags


def flags(**kw):
    base = dict(
        kmsg_file=None,
        state_file=None,
        interval=None,
        expect_gpus=None,
        sysfs_root=None,
        listen=None,
        node_name=None,
        sinks=None,
        slurm_mode=None,
        kubeconfig=None,
        events_file=None,
    )
    return overrides_from_flags(**{**base, **kw})


def test_every_flag_lands_in_its_setting(tmp_path: Path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "agent:\n  fast_interval_s: 60\n  sinks:\n    kubernetes:\n      enabled: true\n"
    )
    over = flags(
        kmsg_file=Path("/k"),
        state_file=Path("/s.json"),
        interval=5.0,
        expect_gpus=4,
        sysfs_root=Path("/fake"),
        listen="127.0.0.1:0",
        node_name="n1",
        sinks=[SinkName.http, SinkName.slurm],
        slurm_mode="standalone",
        kubeconfig=Path("/kc"),
        events_file=Path("/e"),
    )
    cfg = gconfig.load(cfg_file, environ={}, overrides=over)
    a = cfg.agent
    assert a.fast_interval_s == 5.0 and cfg.node.expect_gpus == 4
    assert a.kernel_log.source == "file" and a.kernel_log.file == Path("/k")
    assert a.sinks.state_file.path == Path("/s.json") and a.sinks.http.listen == "127.0.0.1:0"
    assert a.sysfs_root == Path("/fake") and a.node_name == "n1"
    assert a.events_file == Path("/e")
    assert (a.sinks.http.enabled, a.sinks.slurm.enabled) == (True, True)
    assert (a.sinks.kubernetes.enabled, a.sinks.state_file.enabled) == (False, False)
    assert a.sinks.slurm.mode == "standalone"
    assert a.sinks.kubernetes.kubeconfig == Path("/kc")


def test_no_flags_change_nothing(tmp_path: Path):
    assert flags() == {}
    cfg = gconfig.load(None, environ={"GPUVIGIL__AGENT__FAST_INTERVAL_S": "7"})
    assert cfg.agent.fast_interval_s == 7
