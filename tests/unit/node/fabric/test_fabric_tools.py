"""The RDMA tools' outputs (ibstat, ibstatus, ibv_devinfo, ibdev2netdev, fi_info) read into
FabricReadings and judged by the same fabric rules as sysfs.

Real outputs: `ibstat`/`ibstatus` from ../shared/corpus/network (leptonai/gpud testdata;
provenance and ground truth in its MANIFEST.tsv), and data/*_real_*.txt: verbatim excerpts of
outputs posted publicly, each cited on its test (ground truth read from the post). The other
files under data/ are invented edge cases and say so.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuvigil.node.checks.fabric import fabric_tools as ft
from gpuvigil.node.checks.fabric import rules
from gpuvigil.node.checks.fabric.rules import FabricExpectation
from gpuvigil.node.config import FabricConfig

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


def test_ibv_devinfo_real_deepep_60_ib_port_down() -> None:
    # Verbatim excerpt (mlx5_0 and mlx5_6 blocks) of https://github.com/deepseek-ai/DeepEP/issues/60:
    # ConnectX-7 (4129, fw 28.39.2048) InfiniBand port "PORT_DOWN (1)"; ConnectX-5 (4119,
    # fw 16.32.1010) Ethernet port "PORT_ACTIVE (4)".
    reading = ft.parse_ibv_devinfo((DATA / "ibv_devinfo_real_deepep_60.txt").read_text())
    assert not reading.problems
    assert [(a.name, a.kind, a.hca_type) for a in reading.adapters] == [
        ("mlx5_0", "ib", "4129"),
        ("mlx5_6", "roce", "4119"),
    ]
    assert [a.ports[0].state for a in reading.adapters] == ["DOWN", "ACTIVE"]
    assert judge(reading) == [("FABRIC_PORT_DOWN", "nic:mlx5_0")]


def test_ibv_devinfo_real_deepep_38_roce_active() -> None:
    # Verbatim excerpt (mlx5_2 block) of https://github.com/deepseek-ai/DeepEP/issues/38
    # ("H100 with ROCE"): ConnectX-7 fw 28.42.1000, Ethernet link layer, PORT_ACTIVE.
    reading = ft.parse_ibv_devinfo((DATA / "ibv_devinfo_real_deepep_38.txt").read_text())
    (adapter,) = reading.adapters
    assert (adapter.name, adapter.kind, adapter.ports[0].state) == ("mlx5_2", "roce", "ACTIVE")
    assert judge(reading, kind="roce", count=1) == []
    assert judge(reading, kind="ib", count=1) == [("FABRIC_COUNT_LOW", "node")]


def test_ibv_devinfo_real_azure_vm_name() -> None:
    # Verbatim excerpt (first block) of https://github.com/Azure/azhpc-images/pull/44: the
    # Azure udev name rdmaP23800p0s2, ConnectX-4 Lx VF (4118, fw 14.25.8102), Ethernet, ACTIVE.
    reading = ft.parse_ibv_devinfo((DATA / "ibv_devinfo_real_azhpc_images_44.txt").read_text())
    assert [(a.name, a.kind) for a in reading.adapters] == [("rdmaP23800p0s2", "roce")]
    assert not reading.problems and judge(reading) == []


def test_ibv_devinfo_roce_port_down() -> None:
    # Invented edge case (nine RoCE HCAs, one down) in the layout of the DeepEP posts above.
    reading = ft.parse_ibv_devinfo((DATA / "ibv_devinfo_roce9_mlx5_5_down.txt").read_text())
    assert [a.kind for a in reading.adapters] == ["roce"] * 9
    assert judge(reading) == [("FABRIC_PORT_DOWN", "nic:mlx5_5")]
    assert judge(reading, kind="roce", count=10) == [
        ("FABRIC_COUNT_LOW", "node"),
        ("FABRIC_PORT_DOWN", "nic:mlx5_5"),
    ]


def test_ibv_devinfo_verbose_phys_state() -> None:
    # Invented edge case: `ibv_devinfo -v` adds phys_state/active_width/active_speed.
    reading = ft.parse_ibv_devinfo((DATA / "ibv_devinfo_v_ib8_mlx5_3_polling.txt").read_text())
    port = reading.adapters[3].ports[0]
    assert (port.state, port.phys_state) == ("DOWN", "Polling")
    assert judge(reading, kind="ib", count=8) == [("FABRIC_PORT_DOWN", "nic:mlx5_3")]


def test_ibdev2netdev_real_imbue_ipoib_down_is_not_a_port_down() -> None:
    # Verbatim `ibdev2netdev | column -t` (with the poster's comments) from
    # https://github.com/imbue-ai/cluster-health/issues/4: 8 CX-7 InfiniBand ports whose IPoIB
    # side reads "(Down)" ("up/down here is ... about the IP / ethernet side"), and 4 CX-6
    # Ethernet ports, two Up (mlx5_1, mlx5_7) and two Down (mlx5_2, mlx5_8).
    reading = ft.parse_ibdev2netdev((DATA / "ibdev2netdev_real_imbue_issue4.txt").read_text())
    assert len(reading.adapters) == 12 and not reading.problems
    assert [a.kind for a in reading.adapters].count("ib") == 8
    down = [("FABRIC_PORT_DOWN", "nic:mlx5_2"), ("FABRIC_PORT_DOWN", "nic:mlx5_8")]
    assert judge(reading) == down
    assert judge(reading, kind="ib", count=8) == []


def test_ibdev2netdev_real_sriov_virtual_functions() -> None:
    # Verbatim excerpt of https://github.com/openshift/sriov-network-operator/issues/635: VFs
    # (ibp75s0v7, ibp141s0v0..v6) listed as devices of their own, IPoIB Down; one Ethernet
    # port (mlx5_4 enp97s0f0) Up.
    text = (DATA / "ibdev2netdev_real_sriov_operator_635.txt").read_text()
    reading = ft.parse_ibdev2netdev(text)
    assert len(reading.adapters) == 16 and not reading.problems
    eth = [a.name for a in reading.adapters if a.kind != "ib"]
    assert eth == ["mlx5_4"] and judge(reading) == []


def test_ibdev2netdev_real_ib_sriov_cni_plain_and_verbose() -> None:
    # Verbatim from k8snetworkplumbingwg/ib-sriov-cni README.md ("Enable SR-IOV in the NIC's
    # Driver"): plain output of two ConnectX-4 IB ports, then `ibdev2netdev -v` after four VFs
    # were created. `-v` pads the VF port state: "port 1 (DOWN  ) ==> ib2 (Down)". The parser
    # read those lines as unreadable (CHECK_ERROR) before the state pattern allowed padding.
    plain = ft.parse_ibdev2netdev((DATA / "ibdev2netdev_real_ib_sriov_cni.txt").read_text())
    assert [(a.name, a.kind) for a in plain.adapters] == [("mlx5_0", "ib"), ("mlx5_1", "ib")]
    assert judge(plain, kind="ib", count=2) == []
    verbose = ft.parse_ibdev2netdev((DATA / "ibdev2netdev_v_real_ib_sriov_cni.txt").read_text())
    assert not verbose.problems
    states = {a.name: (a.pci_address, a.ports[0].state) for a in verbose.adapters}
    assert states["mlx5_0"] == ("0000:02:00.0", "ACTIVE")
    assert states["mlx5_5"] == ("0000:02:00.2", "DOWN")
    assert judge(verbose) == [("FABRIC_PORT_DOWN", f"nic:mlx5_{i}") for i in range(2, 6)]


def test_ibdev2netdev_verbose_port_state() -> None:
    # Invented edge case: eight ConnectX-7 IB ports, one DOWN, in the `-v` layout.
    reading = ft.parse_ibdev2netdev((DATA / "ibdev2netdev_v_ib8_mlx5_6_down.txt").read_text())
    assert reading.adapters[0].pci_address == "0000:18:00.0"
    assert judge(reading, kind="ib", count=8) == [("FABRIC_PORT_DOWN", "nic:mlx5_6")]


def test_fi_info_counts_devices_not_endpoints() -> None:
    # Invented edge case: libfabric 2.x lists each device under the efa and efa-direct
    # fabrics and both endpoint types (four entries per device).
    (reading,) = ft.fi_info_reading((DATA / "fi_info_v2_efa_direct_2dev.txt").read_text())
    assert reading.fi_info is not None and reading.fi_info.domains == ("rdmap47s0", "rdmap48s0")
    assert judge(reading, kind="efa", count=2) == []
    assert judge(reading, kind="efa", count=4) == [("FABRIC_COUNT_LOW", "node")]


def test_fi_info_p4d() -> None:
    # Invented edge case: libfabric 1.11 layout ("fabric: EFA-fe80::...", version 111.20),
    # rdmap device names, p4d.24xlarge (4 devices).
    (reading,) = ft.fi_info_reading((DATA / "fi_info_p4d_4dev.txt").read_text())
    assert len(reading.fi_info.domains) == 4
    assert judge(reading, kind="efa", count=4) == []


def test_fi_info_real_behind_mpirun_prefixes_is_one_node_per_rank() -> None:
    # Verbatim launcher log from aws-ia/terraform-aws-eks-blueprints
    # patterns/elastic-fabric-adapter/README.md (stored version of that file; the markdown
    # list indent removed): ssh warnings, then "[1,1]<stdout>:provider: efa" blocks from two
    # MPIJob workers, one device rdmap197s0 each, provider version 116.10.
    text = (DATA / "fi_info_real_mpirun_eks_blueprints.txt").read_text()
    readings = ft.fi_info_reading(text)
    assert [r.source for r in readings] == ["fi_info (mpirun rank 0)", "fi_info (mpirun rank 1)"]
    assert all(r.fi_info.domains == ("rdmap197s0",) and not r.problems for r in readings)
    assert ft.parse_fi_info(text) == ("rdmap197s0",)
    assert all(judge(r, kind="efa", count=1) == [] for r in readings)


def test_fi_info_real_libfabric_5689_rdm_dgrm_and_rxd() -> None:
    # Verbatim `fi_info -p efa` from https://github.com/ofiwg/libfabric/issues/5689 (2020,
    # provider version 2.0): device efa_0 as efa_0-rdm, efa_0-dgrm and under "efa;ofi_rxd".
    (reading,) = ft.fi_info_reading((DATA / "fi_info_real_libfabric_5689.txt").read_text())
    assert reading.fi_info.domains == ("efa_0",) and not reading.problems
    assert judge(reading, kind="efa", count=1) == []
    assert judge(reading, kind="efa", count=4) == [("FABRIC_COUNT_LOW", "node")]


@pytest.mark.parametrize(
    ("name", "devices"),
    [
        ("fi_info_real_awsdocs_p3dn.txt", ("efa_0",)),
        ("fi_info_real_awsdocs_p4d.txt", ("efa_0", "efa_1", "efa_2", "efa_3")),
    ],
)
def test_fi_info_real_aws_user_guide(name: str, devices: tuple[str, ...]) -> None:
    # Verbatim `fi_info -p efa -t FI_EP_RDM` examples (unindented, provider versions 2.0 and
    # 111.0) from awsdocs/amazon-ec2-user-guide doc_source/efa-start-nccl-base.md: p3dn.24xlarge
    # with one EFA, p4d.24xlarge with four.
    (reading,) = ft.fi_info_reading((DATA / name).read_text())
    assert reading.fi_info.domains == devices and not reading.problems
    assert judge(reading, kind="efa", count=len(devices)) == []
    assert judge(reading, kind="efa", count=len(devices) + 1) == [("FABRIC_COUNT_LOW", "node")]


@pytest.mark.parametrize(
    "parse",
    [ft.parse_ibstat, ft.parse_ibstatus, ft.parse_ibv_devinfo, ft.parse_ibdev2netdev],
)
def test_empty_or_foreign_text_is_could_not_tell(parse) -> None:
    for text in ("", "hello\nworld\n", "\x00\xff" * 50):
        reading = parse(text)
        assert reading.problems, (parse.__name__, text)
        assert {c for c, _ in judge(reading)} == {"CHECK_ERROR"}
