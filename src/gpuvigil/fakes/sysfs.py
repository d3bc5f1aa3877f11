"""Fake sysfs trees in a folder: RDMA adapters (InfiniBand, RoCE, EFA), their PCI devices
and network interfaces, NVIDIA GPU PCI devices, and the DMI product name.

Used by the fabric/PCIe tests, the agent's tests and the simulator, so the layout follows
the kernel's (checked against a real H100 node's /sys/class/infiniband):

    <root>/sys/class/infiniband/<dev>/{hca_type,fw_ver,board_id,device -> PCI dir}
    <root>/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}
    <root>/sys/class/infiniband/<dev>/ports/<n>/{counters,hw_counters}/<name>
    <root>/sys/devices/pci0000:00/<addr>/{vendor,class,current_link_speed,max_link_speed,
                                          current_link_width,max_link_width,driver -> ...}
    <root>/sys/devices/pci0000:00/<addr>/net/<if>/{operstate,carrier}   (EFA, RoCE)
    <root>/sys/bus/pci/devices/<addr> -> the PCI dir;  <root>/sys/class/net/<if> -> net dir
    <root>/sys/devices/virtual/dmi/id/product_name

The helpers change the tree the way faults change a real one: `port_down` (for EFA only the
network interface goes down: the EFA driver keeps reporting ACTIVE/LinkUp), `remove_adapter`,
`degrade_link`, `bump_counter`, `write` (garbage).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

IB_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "port_xmit_wait",
)
EFA_HW_COUNTERS = (
    "lifespan",
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "rdma_read_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)
# sysfs text of a port state / physical state, as the kernel prints them.
STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "LinkUp": 5, "LinkErrorRecovery": 6}
IB_RATE_NAMES = {400: "4X NDR", 200: "4X HDR", 100: "4X EDR", 800: "4X XDR", 40: "4X QDR"}
NVIDIA = "0x10de"
MELLANOX = "0x15b3"
AMAZON = "0x1d0f"


def speed_text(gts: float | None) -> str:
    return "Unknown" if gts is None else f"{gts:.1f} GT/s PCIe"


def rate_text(gbps: float) -> str:
    g = int(gbps) if float(gbps).is_integer() else gbps
    name = IB_RATE_NAMES.get(int(gbps))
    return f"{g} Gb/sec ({name})" if name else f"{g} Gb/sec"


@dataclass
class FakeSysfs:
    """A sysfs tree under `root` (the `CheckContext.root` of the checks that read it)."""

    root: Path
    _next_bus: int = 0x18
    netdev_of: dict[str, str] = field(default_factory=dict)  # adapter -> interface
    pci_of: dict[str, str] = field(default_factory=dict)  # adapter -> PCI address

    # --- paths ---------------------------------------------------------------------------
    @property
    def ib_class(self) -> Path:
        return self.root / "sys/class/infiniband"

    def pci_dir(self, address: str) -> Path:
        return self.root / "sys/devices/pci0000:00" / address

    def port_dir(self, dev: str, port: int = 1) -> Path:
        return self.ib_class / dev / "ports" / str(port)

    def write(self, rel: str | Path, text: str) -> Path:
        """Write any file below the root (for garbage and corner cases)."""
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    # --- devices -------------------------------------------------------------------------
    def new_address(self) -> str:
        addr = f"0000:{self._next_bus:02x}:00.0"
        self._next_bus += 1
        return addr

    def add_pci(
        self,
        address: str | None = None,
        *,
        vendor: str,
        pci_class: str,
        driver: str | None = None,
        speed_gts: float | None = 32.0,
        max_speed_gts: float = 32.0,
        width: int = 16,
        max_width: int = 16,
    ) -> str:
        address = address or self.new_address()
        d = self.pci_dir(address)
        d.mkdir(parents=True, exist_ok=True)
        for name, value in {
            "vendor": vendor,
            "class": pci_class,
            "current_link_speed": speed_text(speed_gts),
            "max_link_speed": speed_text(max_speed_gts),
            "current_link_width": str(width),
            "max_link_width": str(max_width),
        }.items():
            (d / name).write_text(value + "\n")
        bus = self.root / "sys/bus/pci/devices"
        bus.mkdir(parents=True, exist_ok=True)
        _symlink(bus / address, d)
        if driver:
            drv = self.root / "sys/bus/pci/drivers" / driver
            drv.mkdir(parents=True, exist_ok=True)
            _symlink(d / "driver", drv)
        return address

    def add_gpu(self, address: str | None = None, **link: float) -> str:
        """An NVIDIA 3D controller (class 0x0302: H100/A100 SXM) with a PCIe Gen5 x16 link."""
        return self.add_pci(address, vendor=NVIDIA, pci_class="0x030200", driver="nvidia", **link)

    def add_ib(
        self,
        name: str,
        *,
        address: str | None = None,
        rate_gbps: float = 400,
        link_layer: str = "InfiniBand",
        hca_type: str = "MT4129",
        ports: int = 1,
        netdev: str | None = None,
    ) -> str:
        """A ConnectX HCA; `link_layer="Ethernet"` makes it a RoCE adapter."""
        pci_class = "0x020700" if link_layer == "InfiniBand" else "0x020000"
        address = self.add_pci(address, vendor=MELLANOX, pci_class=pci_class, driver="mlx5_core")
        self._adapter(name, address, hca_type=hca_type, fw="28.41.1000")
        for n in range(1, ports + 1):
            self._port(name, n, rate=rate_text(rate_gbps), link_layer=link_layer)
            self._counters(name, n, "counters", IB_COUNTERS)
        if netdev:
            self._netdev(name, address, netdev)
        return name

    def add_efa(self, name: str, *, address: str | None = None, netdev: str | None = None) -> str:
        """An AWS EFA device. `netdev`: its ENA interface (None for an EFA-only interface)."""
        address = self.add_pci(
            address,
            vendor=AMAZON,
            pci_class="0x020000",
            driver="efa",
            max_speed_gts=16.0,
            speed_gts=16.0,
        )
        self._adapter(name, address, hca_type="efa", fw="0.0.0.0")
        self._port(name, 1, rate="100 Gb/sec (4X EDR)", link_layer="Unspecified")
        self._counters(name, 1, "hw_counters", EFA_HW_COUNTERS)
        if netdev:
            self._netdev(name, address, netdev)
        return name

    def set_product_name(self, name: str) -> None:
        self.write("sys/devices/virtual/dmi/id/product_name", name + "\n")

    # --- faults --------------------------------------------------------------------------
    def set_port(
        self,
        dev: str,
        port: int = 1,
        *,
        state: str | None = None,
        phys_state: str | None = None,
        rate_gbps: float | None = None,
    ) -> None:
        d = self.port_dir(dev, port)
        if state is not None:
            (d / "state").write_text(f"{STATES.get(state, 0)}: {state}\n")
        if phys_state is not None:
            (d / "phys_state").write_text(f"{PHYS_STATES.get(phys_state, 0)}: {phys_state}\n")
        if rate_gbps is not None:
            (d / "rate").write_text(rate_text(rate_gbps) + "\n")

    def port_down(self, dev: str, port: int = 1) -> None:
        """Take a link down as the driver shows it. EFA keeps ACTIVE/LinkUp (its driver
        reports them unconditionally); only its network interface loses carrier."""
        if (self.ib_class / dev / "hca_type").read_text().strip() == "efa":
            self.set_netdev(dev, operstate="down", carrier=0)
            return
        self.set_port(dev, port, state="DOWN", phys_state="Disabled", rate_gbps=40)

    def set_netdev(self, dev: str, *, operstate: str, carrier: int | None) -> None:
        net = self.pci_dir(self.pci_of[dev]) / "net" / self.netdev_of[dev]
        (net / "operstate").write_text(operstate + "\n")
        carrier_file = net / "carrier"
        if carrier is None:
            carrier_file.unlink(missing_ok=True)  # reading carrier of a down link: EINVAL
        else:
            carrier_file.write_text(f"{carrier}\n")

    def remove_adapter(self, dev: str) -> None:
        """The adapter vanished (fell off the bus, driver failed to probe)."""
        shutil.rmtree(self.ib_class / dev)

    def degrade_link(
        self, address_or_dev: str, *, width: int | None = None, speed_gts: float | None = None
    ) -> None:
        """Retrain a PCIe link narrower or slower (`speed_gts=None` with width 0: link down)."""
        d = self.pci_dir(self.pci_of.get(address_or_dev, address_or_dev))
        if width is not None:
            (d / "current_link_width").write_text(f"{width}\n")
        if speed_gts is not None or width == 0:
            (d / "current_link_speed").write_text(speed_text(speed_gts) + "\n")

    def bump_counter(self, dev: str, name: str, by: int = 1, *, port: int = 1) -> int:
        for sub in ("counters", "hw_counters"):
            p = self.port_dir(dev, port) / sub / name
            if p.exists():
                value = int(p.read_text().strip() or 0) + by
                p.write_text(f"{value}\n")
                return value
        raise KeyError(f"{dev} port {port} has no counter {name!r}")

    # --- a whole node --------------------------------------------------------------------
    @classmethod
    def node(
        cls,
        root: Path,
        *,
        gpus: int = 8,
        kind: str = "ib",
        adapters: int = 8,
        rate_gbps: float = 400,
        product_name: str | None = None,
    ) -> FakeSysfs:
        """A healthy GPU node: `gpus` GPUs and `adapters` compute adapters of `kind`."""
        fs = cls(Path(root))
        fs.ib_class.mkdir(parents=True, exist_ok=True)
        for _ in range(gpus):
            fs.add_gpu()
        for i in range(adapters):
            if kind == "efa":
                fs.add_efa(f"rdmap{i + 16}s0", netdev=f"eth{i + 1}")
            elif kind == "roce":
                fs.add_ib(
                    f"mlx5_{i}", rate_gbps=rate_gbps, link_layer="Ethernet", netdev=f"eth{i + 1}"
                )
            else:
                fs.add_ib(f"mlx5_{i}", rate_gbps=rate_gbps)
        if product_name:
            fs.set_product_name(product_name)
        return fs

    # --- internals -----------------------------------------------------------------------
    def _adapter(self, name: str, address: str, *, hca_type: str, fw: str) -> None:
        d = self.ib_class / name
        (d / "ports").mkdir(parents=True, exist_ok=True)
        (d / "hca_type").write_text(hca_type + "\n")
        (d / "fw_ver").write_text(fw + "\n")
        (d / "board_id").write_text("FAKE_0001\n")
        _symlink(d / "device", self.pci_dir(address))
        self.pci_of[name] = address

    def _port(self, dev: str, n: int, *, rate: str, link_layer: str) -> None:
        d = self.port_dir(dev, n)
        d.mkdir(parents=True, exist_ok=True)
        (d / "state").write_text("4: ACTIVE\n")
        (d / "phys_state").write_text("5: LinkUp\n")
        (d / "rate").write_text(rate + "\n")
        (d / "link_layer").write_text(link_layer + "\n")

    def _counters(self, dev: str, n: int, sub: str, names: tuple[str, ...]) -> None:
        d = self.port_dir(dev, n) / sub
        d.mkdir(parents=True, exist_ok=True)
        for c in names:
            (d / c).write_text("10\n" if c == "lifespan" else "0\n")

    def _netdev(self, dev: str, address: str, ifname: str) -> None:
        net = self.pci_dir(address) / "net" / ifname
        net.mkdir(parents=True, exist_ok=True)
        (net / "operstate").write_text("up\n")
        (net / "carrier").write_text("1\n")
        cls_net = self.root / "sys/class/net"
        cls_net.mkdir(parents=True, exist_ok=True)
        _symlink(cls_net / ifname, net)
        self.netdev_of[dev] = ifname


def _symlink(link: Path, target: Path) -> None:
    """A relative link, so a copied tree keeps working."""
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))
