"""The RDMA tools' outputs (ibstat, ibstatus, ibv_devinfo, ibdev2netdev, fi_info) read into
FabricReadings and judged by the same fabric rules as sysfs.

Real outputs: `ibstat`/`ibstatus` from ../shared/corpus/network (leptonai/gpud testdata;
provenance and ground truth in its MANIFEST.tsv). The others are our fixtures under data/,
each reproducing the structure of a public post cited on its test.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuvigil.node.config import FabricConfig
from gpuvigil.node.probes import fabric_tools as ft
from gpuvigil.node.rules import fabric as rules
from gpuvigil.node.rules.fabric import FabricExpectation

DATA = Path(__file__).parent / "data"


def judge(reading, **expected):
    found = rules.judge(reading, expected=FabricExpectation(**expected), config=FabricConfig())
    return sorted((f.code, f.component) for f in found)


def manifest(corpus: Path) -> dict[str, dict[str, str]]:
    with (corpus / "network" / "MANIFEST.tsv").open() as f:
        return {row["file"]: row for row in csv.DictReader(f, delimiter="\t")}


def test_ibstat_corpus_matches_ground_truth(corpus: Path) -> None:
    rows = manifest(corpus)
    files = sorted((corpus / "network").glob("ibstat_*.txt"))
    assert len(files) >= 6
    for path in files:
        truth = rows[path.name]
        reading = ft.parse_ibstat(path.read_text())
        ports = [p for a in reading.adapters for p in a.ports]
        active = [p for p in ports if p.state == "ACTIVE" and p.phys_state == "LinkUp"]
        assert len(active) == int(truth["ports_active"]), path.name
        down = [c for c, _ in judge(reading) if c == "FABRIC_PORT_DOWN"]
        assert len(down) == int(truth["ports_down"].split()[0]), path.name
        codes = {c for c, _ in judge(reading)}
        if "ibpanic" in path.name:
            # The listing stopped at mlx5_8: never "8 healthy adapters", could not tell.
            assert codes == {"CHECK_ERROR"}, path.name
        else:
            assert codes <= {"FABRIC_PORT_DOWN"}, (path.name, codes)
            assert all(p.rate_gbps for p in active), path.name


def test_ibstat_ib_compute_ports_pass_when_only_ethernet_is_down(corpus: Path) -> None:
    # MANIFEST: "only Ethernet-side ports down -> an IB-compute check should pass, an
    # all-ports check should fail".
    reading = ft.parse_ibstat(
        (corpus / "network" / "ibstat_12ca_ib8-eth4_3down_gpud.txt").read_text()
    )
    assert judge(reading, kind="ib", count=8) == []
    assert len(judge(reading)) == 3
    assert judge(reading, kind="ib", count=9) == [("FABRIC_COUNT_LOW", "node")]


def test_ibstatus_corpus(corpus: Path) -> None:
    path = corpus / "network" / "ibstatus_a100-azure-vm_9ports_all-active_gpud.txt"
    reading = ft.parse_ibstatus(path.read_text())
    assert len(reading.adapters) == 9
    rates = {a.name: p.rate_gbps for a in reading.adapters for p in a.ports}
    # All ACTIVE/LinkUp: eight InfiniBand HDR ports and mlx5_8, an Ethernet port at 40.
    assert rates["mlx5_8"] == 40.0 and {rates[f"mlx5_{i}"] for i in range(8)} == {200.0}
    assert [a.kind for a in reading.adapters].count("ib") == 8
    assert judge(reading, kind="ib", count=8, rate_gbps=200) == []
    assert judge(reading, kind="ib", count=9) == [("FABRIC_COUNT_LOW", "node")]
    assert judge(reading, rate_gbps=200) == [("FABRIC_RATE_LOW", "nic:mlx5_8")]


def test_ibv_devinfo_roce_port_down() -> None:
    # Structure of https://github.com/deepseek-ai/DeepEP/issues/60 (mlx5_12 "PORT_DOWN (1)",
    # Ethernet) and https://github.com/deepseek-ai/DeepEP/issues/38 (H100 RoCE, 4129).
    reading = ft.parse_ibv_devinfo((DATA / "ibv_devinfo_roce9_mlx5_5_down.txt").read_text())
    assert [a.kind for a in reading.adapters] == ["roce"] * 9
    assert judge(reading) == [("FABRIC_PORT_DOWN", "nic:mlx5_5")]
    assert judge(reading, kind="roce", count=10) == [
        ("FABRIC_COUNT_LOW", "node"),
        ("FABRIC_PORT_DOWN", "nic:mlx5_5"),
    ]


def test_ibv_devinfo_azure_vm_names() -> None:
    # Structure of https://github.com/Azure/azhpc-images/pull/44 (Azure HPC VM device
    # names rdmaP23800p0s2 / ibP57247p0s2, one Ethernet, one InfiniBand).
    reading = ft.parse_ibv_devinfo((DATA / "ibv_devinfo_azure_eth_ib.txt").read_text())
    assert {a.name: a.kind for a in reading.adapters} == {
        "rdmaP23800p0s2": "roce",
        "ibP57247p0s2": "ib",
    }
    assert judge(reading, kind="ib", count=1) == []


def test_ibv_devinfo_verbose_phys_state() -> None:
    # `ibv_devinfo -v` adds phys_state/active_width/active_speed to the same layout.
    reading = ft.parse_ibv_devinfo((DATA / "ibv_devinfo_v_ib8_mlx5_3_polling.txt").read_text())
    port = reading.adapters[3].ports[0]
    assert (port.state, port.phys_state) == ("DOWN", "Polling")
    assert judge(reading, kind="ib", count=8) == [("FABRIC_PORT_DOWN", "nic:mlx5_3")]


def test_ibdev2netdev_ipoib_down_is_not_a_port_down() -> None:
    # Structure of https://github.com/imbue-ai/cluster-health/issues/4: on a pure-IB fabric
    # every IPoIB interface reads "(Down)" ("up/down here is about the IP side"); only the
    # Ethernet (RoCE) interface that is Down is a port down.
    reading = ft.parse_ibdev2netdev((DATA / "ibdev2netdev_ib8_eth4_one_down.txt").read_text())
    assert len(reading.adapters) == 12
    assert judge(reading) == [("FABRIC_PORT_DOWN", "nic:mlx5_2")]
    assert judge(reading, kind="ib", count=8) == []


def test_ibdev2netdev_virtual_functions() -> None:
    # Structure of https://github.com/openshift/sriov-network-operator/issues/635 (VFs
    # ibp75s0v0..v7 listed as devices of their own, IPoIB Down).
    reading = ft.parse_ibdev2netdev((DATA / "ibdev2netdev_vfs.txt").read_text())
    assert len(reading.adapters) == 14 and not reading.problems
    assert judge(reading) == []


def test_ibdev2netdev_verbose_port_state() -> None:
    reading = ft.parse_ibdev2netdev((DATA / "ibdev2netdev_v_ib8_mlx5_6_down.txt").read_text())
    assert reading.adapters[0].pci_address == "0000:18:00.0"
    assert judge(reading, kind="ib", count=8) == [("FABRIC_PORT_DOWN", "nic:mlx5_6")]


def test_fi_info_counts_devices_not_endpoints() -> None:
    # libfabric 2.x lists each device under the efa and efa-direct fabrics and both
    # endpoint types (four entries per device).
    (reading,) = ft.fi_info_reading((DATA / "fi_info_v2_efa_direct_2dev.txt").read_text())
    assert reading.fi_info is not None and reading.fi_info.domains == ("rdmap47s0", "rdmap48s0")
    assert judge(reading, kind="efa", count=2) == []
    assert judge(reading, kind="efa", count=4) == [("FABRIC_COUNT_LOW", "node")]


def test_fi_info_p4d() -> None:
    # libfabric 1.11 layout ("fabric: EFA-fe80::...", version 111.20) as in the public
    # EFA-on-EKS walkthroughs for p4d.24xlarge (4 devices).
    (reading,) = ft.fi_info_reading((DATA / "fi_info_p4d_4dev.txt").read_text())
    assert len(reading.fi_info.domains) == 4
    assert judge(reading, kind="efa", count=4) == []


def test_fi_info_behind_mpirun_prefixes_is_one_node_per_rank() -> None:
    # Structure of aws-ia/terraform-aws-eks-blueprints
    # patterns/elastic-fabric-adapter/README.md @ 2d96b786accf89547351cc8fef8560f553336b23:
    # "[1,1]<stdout>:provider: efa" lines from two workers of an MPIJob.
    text = (DATA / "fi_info_mpirun_2ranks.txt").read_text()
    readings = ft.fi_info_reading(text)
    assert [r.source for r in readings] == ["fi_info (mpirun rank 0)", "fi_info (mpirun rank 1)"]
    assert all(r.fi_info.domains == ("rdmap197s0",) for r in readings)
    assert ft.parse_fi_info(text) == ("rdmap197s0",)
    assert all(judge(r, kind="efa", count=1) == [] for r in readings)


@pytest.mark.parametrize(
    "parse",
    [ft.parse_ibstat, ft.parse_ibstatus, ft.parse_ibv_devinfo, ft.parse_ibdev2netdev],
)
def test_empty_or_foreign_text_is_could_not_tell(parse) -> None:
    for text in ("", "hello\nworld\n", "\x00\xff" * 50):
        reading = parse(text)
        assert reading.problems, (parse.__name__, text)
        assert {c for c, _ in judge(reading)} == {"CHECK_ERROR"}
