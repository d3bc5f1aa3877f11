"""The gres.conf / slurm.conf-fragment rewrite of a degraded node, and the TaskProlog map."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.io import slurm_conf as sc
from gpuvigil.node.slurm_taskprolog import prolog_lines

GRES = "# site gres\nNodeName=gpu[1-3] Name=gpu File=/dev/nvidia[0-7]\nNodeName=cpu1 Name=nic\n"
NODES = "NodeName=gpu[1-3] CPUs=96 Gres=gpu:h100:8,nic:1 State=UNKNOWN # GPU nodes\n"


def test_files_expand_and_compress() -> None:
    files = sc.expand_files("/dev/nvidia[0-2,4-7]")
    assert [sc.device_number(f) for f in files] == [0, 1, 2, 4, 5, 6, 7]
    assert sc.compress_files(files) == "/dev/nvidia[0-2,4-7]"
    assert sc.expand_files("/dev/nvidia0,/dev/nvidia2") == ["/dev/nvidia0", "/dev/nvidia2"]
    assert sc.compress_files(["/dev/nvidia5"]) == "/dev/nvidia5"


def test_degrade_splits_the_node_out_and_restore_gives_the_same_configuration() -> None:
    g = sc.degrade_gres(GRES, "gpu2", uuid="GPU-a", index=3)
    assert "NodeName=gpu1,gpu3 Name=gpu File=/dev/nvidia[0-7]" in g
    assert "NodeName=gpu2 Name=gpu File=/dev/nvidia[0-2,4-7]" in g
    assert sc.markers(g) == [sc.Degraded("gpu2", "GPU-a", 3)]
    assert sc.degrade_gres(g, "gpu2", uuid="GPU-a", index=3) == g  # a repeat: no-op
    for node in ("gpu1", "gpu3"):
        assert sc.node_gpu_files(g, node) == sc.node_gpu_files(GRES, node)
    assert len(sc.node_gpu_files(g, "gpu2")) == 7
    back = sc.restore(g, "gpu2", uuid="GPU-a")
    assert not sc.markers(back)
    assert sc.node_gpu_files(back, "gpu2") == sc.node_gpu_files(GRES, "gpu2")

    n = sc.degrade_count(NODES, "gpu2", uuid="GPU-a", index=3)
    assert sc.node_count(n, "gpu2") == 7 and sc.node_count(n, "gpu1") == 8
    assert "Gres=gpu:h100:7,nic:1" in n and "# GPU nodes" in n
    assert sc.node_count(sc.restore(n, "gpu2", uuid="GPU-a"), "gpu2") == 8


def test_refusals() -> None:
    g = sc.degrade_gres(GRES, "gpu2", uuid="GPU-a", index=3)
    with pytest.raises(sc.ConfError, match="already has GPU GPU-a"):
        sc.degrade_gres(g, "gpu2", uuid="GPU-b", index=4)  # a second GPU: the whole node
    with pytest.raises(sc.ConfError, match="device number 9"):
        sc.degrade_gres(GRES, "gpu2", uuid="GPU-a", index=9)
    with pytest.raises(sc.ConfError, match="no NodeName line"):
        sc.degrade_count(NODES, "gpu9", uuid="GPU-a", index=0)
    with pytest.raises(sc.ConfError, match="exactly one gpu"):
        sc.degrade_count("NodeName=g Gres=nic:1\n", "g", uuid="U", index=0)


def test_count_and_per_file_lines() -> None:
    text = "NodeName=g Name=gpu File=/dev/nvidia0 Count=1\nNodeName=g Name=gpu File=/dev/nvidia1\n"
    out = sc.degrade_gres(text, "g", uuid="U", index=0)
    assert sc.node_gpu_files(out, "g") == ["/dev/nvidia1"]  # the one-file line commented out
    assert sc.restore(out, "g", uuid="U") == text
    assert sc.gres_count("gpu:h100:7(S:0-1),nic:1") == 7 and sc.gres_count("(null)") is None


@given(st.text(max_size=300))
def test_garbage_never_raises_anything_but_conf_error(text: str) -> None:
    sc.markers(text)
    sc.node_gpu_files(text, "n")
    sc.node_count(text, "n")
    sc.restore(text, "n", uuid="U")
    for change in (sc.degrade_gres, sc.degrade_count):
        try:
            change(text, "n", uuid="U", index=0)
        except sc.ConfError:
            pass


def test_taskprolog_maps_positions_to_device_numbers() -> None:
    g = sc.degrade_gres(GRES, "gpu2", uuid="GPU-a", index=3)
    env = {"SLURMD_NODENAME": "gpu2", "CUDA_VISIBLE_DEVICES": "2,3,4"}
    assert prolog_lines(env, g) == [
        "export CUDA_VISIBLE_DEVICES=2,4,5",
        "export GPU_DEVICE_ORDINAL=2,4,5",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
    ]
    assert prolog_lines({"SLURMD_NODENAME": "gpu2"}, g) == []  # no GPU allocated
    for bad_env, text in ((env, None), ({**env, "CUDA_VISIBLE_DEVICES": "7"}, g)):
        lines = prolog_lines(bad_env, text)  # fail closed: no GPU at all
        assert lines[0] == "export CUDA_VISIBLE_DEVICES=" and lines[-1].startswith("print ")
