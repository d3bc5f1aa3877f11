"""A real Prometheus scrapes the agent's /metrics: every canonical family is ingested, and
an Xid shows up as gpuvigil_node_condition{condition="GPUXidError"} == 1."""

from __future__ import annotations

import agent_helpers
import pytest

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts
XID79 = (
    "[ 1500.000000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)


def test_prometheus_scrapes_the_agent(start_agent, prometheus_factory):
    a = start_agent({}, "--interval", "1")
    prom = prometheus_factory([a.url.removeprefix("http://")])
    prom.wait_for('up{job="gpuvigil"} == 1', timeout=30)
    for name in (
        "gpuvigil_agent_info",
        "gpuvigil_check_status",
        "gpuvigil_check_could_not_run",
        "gpuvigil_check_last_success_timestamp_seconds",
        "gpuvigil_check_duration_seconds_count",
        "gpuvigil_check_runs_total",
        "gpuvigil_node_condition",
        "gpuvigil_agent_loop_last_timestamp_seconds",
        "gpuvigil_kmsg_gaps_total",
    ):
        assert prom.wait_for(name, timeout=15), name
    info = prom.query("gpuvigil_agent_info")[0]["metric"]
    assert info["node"] == "gpu-test-1" and info["version"]
    a.machine.log(XID79)
    prom.wait_for('gpuvigil_node_condition{condition="GPUXidError"} == 1', timeout=20)
    prom.wait_for('gpuvigil_xid_events_total{code="79",gpu="0"} == 1', timeout=10)
