"""Controller benchmark: 5,000 nodes, 500 simultaneous faults.

Measures, for one reconcile pass right after the faults land: the time until every node has
its decision, API calls per decision, and the controller's memory; the baseline is a quiet
pass over the same fleet (no faults, after two warm-up passes: the steady state, where
unchanged nodes reuse their decision) measured in the same run, so the ratio says what a
fault storm costs on top of steady state.

    PYTHONPATH=src python bench/controller.py                    # in-memory cluster
    PYTHONPATH=src:tests python bench/controller.py --real --nodes 2000   # real kube-apiserver
    PYTHONPATH=src:tests python bench/controller.py --real --nodes 20000 --faults 2000

On the real API server the adapter reads one LIST and then a WATCH, so the storm is timed
from the moment the last fault was written until every faulty node has a decision other
than HEALTHY (passes run back to back while the watch delivers the faults); each line says
how many times the policy ran, against the nodes listed (unchanged nodes reuse their
decision).

The faults: 60% fatal Xid (drain at once), 30% non-fatal (block, drain later), 10%
INVESTIGATE (quarantine). The safety defaults hold (budget 2 per pool, breaker on), so the
storm also trips the breaker: this is the real-world shape of a 10% fault storm.
"""

from __future__ import annotations

import argparse
import gc
import resource
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gpuvigil.core import wire
from gpuvigil.core.findings import Action, Status, utcnow
from gpuvigil.core.wire import FindingSummary, HealthSummary
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig

FATAL = FindingSummary(
    code="XID_79",
    component="gpu:3",
    status=Status.FAILED,
    action=Action.RESET_GPU,
    fatal=True,
    check="xid",
)
NONFATAL = FindingSummary(
    code="NVLINK_ERRORS",
    component="gpu:1",
    status=Status.FAILED,
    action=Action.RESET_GPU,
    check="nvlink",
)
INVESTIGATE = FindingSummary(
    code="GPU_SDC",
    component="gpu:2",
    status=Status.FAILED,
    action=Action.INVESTIGATE,
    check="matmul",
)


def fault_for(i: int) -> FindingSummary:
    return (FATAL, FATAL, FATAL, FATAL, FATAL, FATAL, NONFATAL, NONFATAL, NONFATAL, INVESTIGATE)[
        i % 10
    ]


def measure(ctl: Controller, calls: Callable[[], int]) -> dict[str, float]:
    gc.collect()
    before = calls()
    t0 = time.perf_counter()
    result = ctl.reconcile()
    elapsed = time.perf_counter() - t0
    n = len(result.decisions)
    assert result.listed and n, "the pass did not decide"
    changed = sum(1 for d in result.decisions.values() if d.store)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "decisions": n,
        "changed": changed,
        "seconds": elapsed,
        "calls": calls() - before,
        "rss_mib": rss,
        "errors": len(result.errors),
        "breaker": float(result.breaker_open),
        "decided": result.decided,
    }


def faulty_names(nodes: int, faults: int) -> set[str]:
    return {f"gpu-{i * (nodes // faults):05d}" for i in range(faults)}


def until_decided(
    ctl: Controller, calls: Callable[[], int], *, faulty: set[str]
) -> dict[str, float]:
    """Passes from the moment the last fault was written until every faulty node has a
    decision other than HEALTHY (the node watch delivers the faults while passes run):
    the time a storm takes to be decided, as an operator would see it."""
    gc.collect()
    before, t0, passes, decided = calls(), time.perf_counter(), 0, 0
    seen: dict[str, object] = {}
    while time.perf_counter() - t0 < 300:
        result = ctl.reconcile()
        passes += 1
        decided += result.decided
        seen.update({n: d for n, d in result.decisions.items() if n in faulty})
        if all(n in seen and seen[n].state.value != "HEALTHY" for n in faulty):  # type: ignore[attr-defined]
            break
    elapsed = time.perf_counter() - t0
    changed = sum(1 for n in faulty if n in seen)
    return {
        "decisions": len(result.decisions),
        "changed": changed,
        "seconds": elapsed,
        "calls": calls() - before,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "errors": len(result.errors),
        "breaker": float(result.breaker_open),
        "passes": passes,
        "decided": decided,
    }


def report(label: str, quiet: dict[str, float], storm: dict[str, float]) -> None:
    print(f"\n== {label}")
    for name, m in (("quiet (baseline)", quiet), ("fault storm", storm)):
        print(
            f"{name:>18}: {m['decisions']:.0f} decisions ({m['changed']:.0f} changed) in "
            f"{m['seconds']:.2f} s; {m['calls']:.0f} API calls = "
            f"{m['calls'] / m['decisions']:.3f}/decision, "
            f"{m['calls'] / max(1, m['changed']):.1f}/changed node; "
            f"process max RSS {m['rss_mib']:.0f} MiB; breaker "
            f"{'open' if m['breaker'] else 'closed'}; errors {m['errors']:.0f}"
            + (f"; {m['passes']:.0f} passes, policy ran {m['decided']:.0f} times"
               if "passes" in m else f"; policy ran {m['decided']:.0f} times")
        )  # fmt: skip
    print(
        f"{'ratio storm/quiet':>18}: time x{storm['seconds'] / quiet['seconds']:.2f}, "
        f"calls x{storm['calls'] / max(1, quiet['calls']):.1f}"
    )


def memory_bench(nodes: int, faults: int) -> None:
    c = MemoryCluster()
    for i in range(nodes):
        c.add_node(f"gpu-{i:05d}", pool=f"pool{i % 10}", pods=2)
    ctl = Controller(c, config=ControllerConfig(), clock=c.clock.now)
    calls = lambda: sum(c.calls.values())  # noqa: E731
    ctl.reconcile()  # warm-up (imports, caches); every node decided
    ctl.reconcile()  # seen unchanged: from now on quiet nodes reuse their decision
    quiet = measure(ctl, calls)
    for i in range(faults):
        c.set_findings(f"gpu-{i * (nodes // faults):05d}", [fault_for(i)])
    storm = measure(ctl, calls)
    report(f"in-memory cluster: {nodes} nodes, {faults} faults", quiet, storm)


def real_bench(nodes: int, faults: int) -> None:
    from kubernetes import client

    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings
    from realparts import kube as kube_mod  # tests/realparts: PYTHONPATH=src:tests

    ok, why = kube_mod.available()
    if not ok:
        sys.exit(f"real API server unavailable: {why}")
    workdir = kube_mod.make_workdir()
    kube = kube_mod.KubeCluster(workdir)
    kube.start()
    try:
        api = kube.api_client()
        v1 = client.CoreV1Api(api)
        kube.ensure_namespace("gpuvigil")  # the leader Lease: the budget ledger lives there
        healthy = HealthSummary(generated_at=utcnow(), status=Status.OK, findings=[])

        def create(i: int) -> None:
            name = f"gpu-{i:05d}"
            v1.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": {"gpuvigil.io/pool": f"pool{i % 10}"},
                        "annotations": {wire.HEALTH_ANNOTATION: healthy.model_dump_json()},
                    },
                }
            )
            # Admission adds node.kubernetes.io/not-ready (no kubelet will lift it): a
            # foreign block gpuvigil would rightly leave alone, so lift it here.
            v1.patch_node(name, {"spec": {"taints": []}})

        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(nodes)))
        print(f"created {nodes} nodes in {time.perf_counter() - t0:.1f} s")
        adapter = KubernetesCluster(KubernetesSettings(), api_client=kube.api_client())
        ctl = Controller(adapter, config=ControllerConfig())
        calls = lambda: sum(adapter.calls.values())  # noqa: E731
        ctl.reconcile()  # warm-up; also records HEALTHY for nothing (no writes when quiet)
        ctl.reconcile()  # seen unchanged: quiet nodes reuse their decision from now on
        quiet = measure(ctl, calls)

        def fault(i: int) -> None:
            bad = HealthSummary(
                generated_at=utcnow(), status=Status.FAILED, findings=[fault_for(i)]
            )
            v1.patch_node(
                f"gpu-{i * (nodes // faults):05d}",
                {"metadata": {"annotations": {wire.HEALTH_ANNOTATION: bad.model_dump_json()}}},
            )

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(fault, range(faults)))
        storm = until_decided(ctl, calls, faulty=faulty_names(nodes, faults))
        report(f"real kube-apiserver 1.20.2: {nodes} nodes, {faults} faults", quiet, storm)
        adapter.close()
    finally:
        kube.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--faults", type=int, default=500)
    p.add_argument("--real", action="store_true", help="also run against a real kube-apiserver")
    args = p.parse_args(argv)
    memory_bench(args.nodes, args.faults)
    if args.real:
        real_bench(args.nodes, args.faults)


if __name__ == "__main__":
    main()
