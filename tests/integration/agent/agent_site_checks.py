"""Site checks for the agent's subprocess tests, loaded through `agent.check_modules`.

Each runs a fake tool through the fail-closed runner, the way every real check does, so
the tests can make a tool fail, hang, stop itself (SIGSTOP) or vanish while the agent runs:
- `site_link`: `gpuvigil-fake-link` prints `up` or `down` (NVLINK_DOWN when down);
- `site_heartbeat`: `gpuvigil-fake-heartbeat` prints anything; always fine.
"""

from __future__ import annotations

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.io import exec as ex
from gpuvigil.node.checks import CheckContext, Needs, check


@check(
    "site_link",
    group="fast",
    interval_s=30,
    timeout_s=2.0,
    needs=Needs(binaries=("gpuvigil-fake-link",)),
)
def site_link(ctx: CheckContext) -> list[Finding]:
    """A link state read from a fake tool."""
    res = ex.run(["gpuvigil-fake-link"], timeout_s=1.0, env=ctx.env)
    bad = ex.failure_finding(res, check="site_link")
    if bad is not None:
        return [bad]
    if res.text.strip() == "down":
        return [
            Finding(
                check="site_link",
                status=Status.FAILED,
                code="NVLINK_DOWN",
                component="gpu:0",
                action=Action.RESET_GPU,
                message="link 0 down",
            )
        ]
    return []


@check(
    "site_heartbeat",
    group="fast",
    interval_s=30,
    timeout_s=2.0,
    needs=Needs(binaries=("gpuvigil-fake-heartbeat",)),
)
def site_heartbeat(ctx: CheckContext) -> list[Finding]:
    """Always fine: proves the other checks keep publishing while one hangs."""
    res = ex.run(["gpuvigil-fake-heartbeat"], timeout_s=1.0, env=ctx.env)
    bad = ex.failure_finding(res, check="site_heartbeat")
    return [bad] if bad is not None else []
