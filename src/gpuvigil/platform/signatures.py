"""Which fleet-wide cause explains a burst of new findings: the circuit breaker's test. Pure.

A bad change (a driver, kernel or image rollout, a config push) shows as one finding code
on many nodes that share what changed. Independent hardware faults land on nodes at random,
a few per day. So the breaker groups the findings that appeared within `breaker_window_s`
by finding (check and code) and by every node attribute it knows (pool, driver version,
kernel, OS image, instance type, zone, rack; `SafetyConfig.breaker_attributes`), and for
each group asks: if faults were independent, how likely is it that this many of the group's
nodes turned up this finding within one window?

Under independence, the number of the n nodes in a group that newly show one finding
within a window of W seconds is at most Poisson with mean lambda = n * r * W / 86400, where
r (`breaker_background_per_node_day`) bounds how often one node turns up one finding per
day. The group trips when k >= `breaker_min_nodes` and P(X >= k) <= `breaker_p_value`.
Thresholds scale by themselves: with the defaults (r = 0.02, W = 600 s, p = 1e-6) a 64-node
pool trips at 3 nodes, a 512-node fleet at 5, 8,192 at 10 (`min_trip`).

Several groups trip together (a bad driver in one pool trips the driver version, the pool
and the fleet): the most specific explanation wins. Greedily, the group with the smallest
P is taken, the findings it explains are removed, and the rest is tested again; so the
breaker names the driver version the 48 nodes share, not "the fleet".

Called by `platform.breaker`; docs/controller.md explains the choice of test and defaults.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuvigil.platform.state import POOL_LABEL

if TYPE_CHECKING:
    from gpuvigil.platform.safety import SafetyConfig
    from gpuvigil.platform.state import NodeView

FLEET = ""  # the attribute of the whole fleet: every node has it, with value ""
ANY = ("*", "*")  # (check, code) of the any-finding group: many codes at once
# GPU feature discovery labels the driver version in three parts; the breaker joins them.
GFD_DRIVER = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
              "nvidia.com/cuda.driver.rev")  # fmt: skip
DRIVER_VERSION = "driver-version"

Key = tuple[str, str]  # (check, code) of a finding


def attributes_of(
    labels: Mapping[str, str], facts: Mapping[str, str], *, pool: str, config: SafetyConfig
) -> dict[str, str]:
    """The attributes the breaker groups by: the pool, then every configured attribute the
    node has (a label, else an adapter fact such as `kernel-version`). Absent ones are
    skipped: a node without a rack label is in no rack group."""
    out = {config.pool_label: pool}
    for name in config.breaker_attributes:
        value = labels.get(name) or facts.get(name)
        if not value and name == DRIVER_VERSION and all(k in labels for k in GFD_DRIVER):
            value = ".".join(labels[k] for k in GFD_DRIVER)
        if value:
            out[name] = value
    return out


def node_attributes(v: NodeView, config: SafetyConfig) -> dict[str, str]:
    from gpuvigil.platform.safety import pool_of

    return attributes_of(v.labels, v.attributes, pool=pool_of(v, config), config=config)


def count(
    attrs: Iterable[Mapping[str, str]], *, pool_label: str = POOL_LABEL
) -> Counter[tuple[str, str]]:
    """How many nodes carry each (attribute, value); (FLEET, "") is the fleet's size; and
    per pool, (`in_pool(attribute, pool)`, value): whether a value is a minority there."""
    out: Counter[tuple[str, str]] = Counter()
    for a in attrs:
        out[(FLEET, "")] += 1
        out.update(a.items())
        pool = a.get(pool_label, "")
        out.update((in_pool(k, pool), v) for k, v in a.items() if k != pool_label)
    return out


def in_pool(attribute: str, pool: str) -> str:
    """The census key of an attribute counted within one pool."""
    return f"{attribute}@pool={pool}"


def census(nodes: Sequence[NodeView], config: SafetyConfig) -> Counter[tuple[str, str]]:
    """Group sizes for the test. A node list that knows the whole fleet while listing only
    part of it (the simulator lists only nodes in an episode) carries its own `census`."""
    own = getattr(nodes, "census", None)
    if own is not None:
        return own  # type: ignore[no-any-return]
    return count((node_attributes(v, config) for v in nodes), pool_label=config.pool_label)


def log_poisson_tail(k: int, lam: float) -> float:
    """log P(X >= k) for X ~ Poisson(lam), summed upwards in log space: exact for the tiny
    tails that matter here (a burst of 300 nodes has P far below the smallest float)."""
    if k <= 0:
        return 0.0
    if lam <= 0:
        return -math.inf
    log_lam = math.log(lam)
    first = -lam + k * log_lam - math.lgamma(k + 1)
    total, term, i = 1.0, 1.0, k  # the sum relative to the first term
    while True:
        i += 1
        term *= lam / i
        total += term
        if i > lam and term <= total * 1e-12:
            return min(0.0, first + math.log(total))


def poisson_tail(k: int, lam: float) -> float:
    """P(X >= k) for X ~ Poisson(lam) (0.0 below the smallest float)."""
    return math.exp(log_poisson_tail(k, lam))


def expected(population: int, config: SafetyConfig, window_s: float | None = None) -> float:
    """Mean number of a group's nodes that show one finding within a window (default
    `breaker_window_s`) by chance."""
    window = config.breaker_window_s if window_s is None else window_s
    return population * config.breaker_background_per_node_day * window / 86400


def min_trip(population: int, config: SafetyConfig) -> int:
    """The fewest nodes of a group this size that trip the breaker (for docs and tests)."""
    lam, k = expected(population, config), config.breaker_min_nodes
    while k <= population and log_poisson_tail(k, lam) > math.log(config.breaker_p_value):
        k += 1
    return k


@dataclass(frozen=True)
class Signature:
    """One finding (check and code; `ANY` for many codes) concentrated on nodes sharing one
    attribute value (attribute FLEET: the whole fleet)."""

    check: str
    code: str
    attribute: str
    value: str

    @property
    def key(self) -> Key:
        return (self.check, self.code)

    @property
    def id(self) -> str:
        where = f"{self.attribute}={self.value}" if self.attribute else "fleet"
        what = "any finding" if self.key == ANY else f"{self.check}/{self.code}"
        return f"{what}@{where}"

    @property
    def change(self) -> str:
        """The suspected change, for people: what the affected nodes have in common."""
        return f"{self.attribute}={self.value}" if self.attribute else "fleet-wide"

    def covers(self, key: Key, attrs: Mapping[str, str]) -> bool:
        """Whether this finding on a node with these attributes belongs to the signature."""
        if self.attribute and attrs.get(self.attribute) != self.value:
            return False
        return self.key in (ANY, key)


@dataclass(frozen=True)
class Burst:
    """A group that tripped: its signature, the nodes, and the numbers behind the verdict."""

    signature: Signature
    nodes: tuple[str, ...]
    population: int
    expected: float
    log_p: float  # log P(this many by chance): ranks explanations without underflow
    also: tuple[str, ...] = ()  # other attributes exactly these nodes share (same P)
    window_s: float = 0.0  # the window the findings appeared in (0: the caller's)

    @property
    def p(self) -> float:
        return math.exp(self.log_p)

    def p_text(self) -> str:
        if self.log_p > math.log(1e-300):
            return f"P={self.p:.1e}"
        return f"P=1e{self.log_p / math.log(10):.0f}"

    def describe(self, window_s: float) -> str:
        window_s = self.window_s or window_s
        s, what = self.signature, self.signature.id.split("@")[0]
        where = (
            f"nodes with {s.attribute}={s.value} ({len(self.nodes)} of {self.population})"
            if s.attribute
            else f"{len(self.nodes)} of {self.population} nodes"
        )
        return (
            f"{what} on {where} within {window_s:.0f} s; independent faults would explain "
            f"{self.expected:.3g} ({self.p_text()}): suspected change {s.change}"
            + (f" (or {', '.join(self.also)})" if self.also else "")
        )


Admit = Callable[[str, str, str], bool]  # (node, attribute, value): may it name a cause?


def bursts(
    new: Mapping[str, set[Key]],
    attrs: Mapping[str, Mapping[str, str]],
    population: Counter[tuple[str, str]],
    config: SafetyConfig,
    *,
    window_s: float | None = None,
    admit: Admit | None = None,
    no_topology: set[Key] | None = None,
) -> list[Burst]:
    """The signatures that explain the new findings (`new`: node -> keys first seen within
    the window, `window_s`, default `breaker_window_s`; `attrs`: node -> its attributes),
    most specific first; see the module docstring. `admit` says which of a node's
    attributes may name a cause (`platform.breaker`: only a suspected change, a big
    enough pool, or topology); findings in `no_topology` are not grouped by a topology
    attribute (they spread beyond one rack: `platform.breaker`). Cost: the new findings
    times the attributes, per round."""
    window = config.breaker_window_s if window_s is None else window_s
    topology = set(config.breaker_topology_attributes)
    left = {n: set(keys) for n, keys in new.items() if keys}
    out: list[Burst] = []
    while left:
        groups: dict[Signature, set[str]] = {}
        for node, keys in left.items():
            for attribute, value in [(FLEET, ""), *attrs[node].items()]:
                if admit is not None and not admit(node, attribute, value):
                    continue
                for check, code in [*keys, ANY]:
                    if no_topology and attribute in topology and (check, code) in no_topology:
                        continue
                    groups.setdefault(Signature(check, code, attribute, value), set()).add(node)
        # One finding on many nodes first; many codes at once only for what that leaves.
        burst = _best(groups, population, config, window, topology, any_code=False) or _best(
            groups, population, config, window, topology, any_code=True
        )
        if burst is None:
            return out
        out.append(burst)
        for node in burst.nodes:
            keys = left[node]
            if burst.signature.key == ANY:
                keys.clear()
            else:
                keys.discard(burst.signature.key)
            if not keys:
                del left[node]
    return out


def _best(
    groups: Mapping[Signature, set[str]],
    population: Counter[tuple[str, str]],
    config: SafetyConfig,
    window_s: float,
    topology: set[str],
    *,
    any_code: bool,
) -> Burst | None:
    """The group with the smallest P that trips (ties: the smaller group, then a change
    before topology, then by name), naming the other attributes its nodes share exactly as
    well (`Burst.also`)."""
    tripped: list[tuple[float, int, bool, str, Burst]] = []
    limit = math.log(config.breaker_p_value)
    where = {FLEET, config.pool_label, *topology}  # groups that name no change
    fewest = min(config.breaker_min_nodes, config.breaker_min_change_nodes)
    for sig, nodes in groups.items():
        if (sig.key == ANY) is not any_code or len(nodes) < fewest:
            continue
        n = max(population.get((sig.attribute, sig.value), 0), len(nodes))
        # fewer than breaker_min_nodes only for a change every node carrying it shows
        whole_change = sig.attribute not in where and len(nodes) == n
        if len(nodes) < config.breaker_min_nodes and not whole_change:
            continue
        lam = expected(n, config, window_s)
        log_p = log_poisson_tail(len(nodes), lam)
        if log_p <= limit:
            burst = Burst(sig, tuple(sorted(nodes)), n, lam, log_p, window_s=window_s)
            tripped.append((log_p, n, sig.attribute in topology, sig.id, burst))
    if not tripped:
        return None
    tripped.sort(key=lambda t: t[:4])
    best = tripped[0][4]
    also = tuple(
        b.signature.change
        for *_, b in tripped[1:]
        if b.signature.key == best.signature.key and b.nodes == best.nodes and b.log_p == best.log_p
    )
    return Burst(best.signature, best.nodes, best.population, best.expected, best.log_p, also,
                 window_s)  # fmt: skip
