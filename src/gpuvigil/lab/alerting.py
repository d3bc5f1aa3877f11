"""The lab's alert path (`gpuvigil lab --alerts`): a real Prometheus scrapes every agent and
the controller and evaluates the shipped rules (deploy/prometheus/rules.yaml); a real
Alertmanager routes what fires to a webhook receiver the lab runs. Each alert of a fault is
measured from the fault: when Prometheus had it firing, when Alertmanager delivered it, and
when it delivered its resolution.

Debian's `prometheus` and `prometheus-alertmanager` (scripts/bootstrap-system.sh installs
them); everything listens on 127.0.0.1 and is stopped by PID. Scrapes and evaluations run
every 2 s (the shipped rules' own `for:` durations and windows are kept).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from gpuvigil.io.ports import free_port
from gpuvigil.lab.procs import Proc

SCRAPE_S = 2  # scrape and rule evaluation interval in the lab
# How long Prometheus watches the healthy lab before the first fault, at the least: enough
# evaluations that a rule firing on a healthy fleet would show, however fast the job ran.
HEALTHY_WATCH_S = 15
RULES_DEFAULT = Path(__file__).resolve().parents[3] / "deploy/prometheus/rules.yaml"
BINARIES = {"prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager"}


def missing() -> str:
    """Why the alert path cannot run here, or ""."""
    gone = [pkg for exe, pkg in BINARIES.items() if shutil.which(exe) is None]
    if gone:
        return (f"--alerts needs Debian's {' and '.join(gone)}: run scripts/bootstrap-system.sh "
                "(as root) or apt-get install them")  # fmt: skip
    return ""


def alert_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """One alert's identity: its labels (Prometheus adds none of its own here)."""
    return tuple(sorted(labels.items()))


@dataclass
class Seen:
    """One alert as the lab saw it, in wall-clock seconds (time.time())."""

    labels: dict[str, str]
    fired: float | None = None  # Prometheus had it firing
    delivered: float | None = None  # Alertmanager's webhook delivered it firing
    resolved: float | None = None  # ... and then resolved

    def entry(self, since: float) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - since, 1)

        return {
            "name": self.labels.get("alertname", ""),
            "severity": self.labels.get("severity", ""),
            "fired_after_s": rel(self.fired),
            "delivered_after_s": rel(self.delivered),
            "resolved_after_s": rel(self.resolved),
            "labels": {k: v for k, v in self.labels.items() if k not in ("alertname", "severity")},
        }


@dataclass
class Receiver:
    """The webhook Alertmanager delivers to: every notification, with when it arrived."""

    deliveries: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = {"unreadable": body[:200].decode(errors="replace")}
                with receiver.lock:
                    receiver.deliveries.append((time.time(), doc))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                         name="lab-webhook", daemon=True).start()  # fmt: skip
        return server


class AlertPath:
    """Prometheus + Alertmanager + the webhook, for one lab run."""

    def __init__(self, folder: Path, *, rules: Path) -> None:
        self.dir = folder
        self.rules = rules
        self.receiver = Receiver()
        self.server: ThreadingHTTPServer | None = None
        self.prometheus: Proc | None = None
        self.alertmanager: Proc | None = None
        self.prom_url = self.am_url = ""
        self.seen: dict[tuple[tuple[str, str], ...], Seen] = {}
        self._read = 0  # deliveries already folded into `seen`
        self._polled = 0.0

    def start(self, *, agents: list[str], controller: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.server = self.receiver.serve()
        hook = f"http://127.0.0.1:{self.server.server_address[1]}/"
        am_port, prom_port = free_port(), free_port()
        am_cfg = {
            "route": {
                "receiver": "lab",
                # One notification per alert, at once: the lab measures each.
                "group_by": ["..."],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "4h",
            },
            "receivers": [{"name": "lab",
                           "webhook_configs": [{"url": hook, "send_resolved": True}]}],
            "inhibit_rules": [{
                "source_matchers": ['severity="page"', 'slo=~".+"'],
                "target_matchers": ['severity="ticket"', 'slo=~".+"'],
                "equal": ["slo"],
            }],
        }  # fmt: skip
        (self.dir / "alertmanager.yml").write_text(yaml.safe_dump(am_cfg))
        self.alertmanager = Proc(
            ["prometheus-alertmanager", f"--config.file={self.dir / 'alertmanager.yml'}",
             f"--storage.path={self.dir / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            log=self.dir / "alertmanager.log",
        )  # fmt: skip
        self.am_url = f"http://127.0.0.1:{am_port}"
        prom_cfg = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s",
                       "scrape_timeout": f"{SCRAPE_S}s"},
            "rule_files": [str(self.rules)],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [
                {"job_name": "gpuvigil-agent", "static_configs": [{"targets": agents}]},
                {"job_name": "gpuvigil-controller", "static_configs": [{"targets": [controller]}]},
            ],
        }  # fmt: skip
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        self.prometheus = Proc(
            ["prometheus", f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}",
             "--rules.alert.resend-delay=2s"],
            log=self.dir / "prometheus.log",
        )  # fmt: skip
        self.prom_url = f"http://127.0.0.1:{prom_port}"
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        pending = {
            "prometheus": f"{self.prom_url}/-/ready",
            "alertmanager": f"{self.am_url}/-/ready",
        }
        while pending and time.monotonic() < end:
            for name, url in list(pending.items()):
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            del pending[name]
                except OSError:
                    pass
            for p in (self.prometheus, self.alertmanager):
                if p is not None and not p.alive():
                    raise RuntimeError(f"{p.argv[0]} exited:\n{p.log_tail()}")
            time.sleep(0.2)
        if pending:
            raise RuntimeError(f"{', '.join(pending)} not ready after {timeout:g} s")

    def dead(self) -> list[str]:
        return [p.argv[0] for p in (self.prometheus, self.alertmanager)
                if p is not None and not p.alive()]  # fmt: skip

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            return list(json.load(r)["data"]["result"])

    def panel(self, expr: str) -> dict[str, float]:
        """A dashboard query's instant values, keyed by their labels (`k=v,...`)."""
        try:
            rows = self.query(expr)
        except (OSError, ValueError, KeyError):
            return {}
        return {",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): float(r["value"][1])
                for r in rows}  # fmt: skip

    def poll(self, *, every_s: float = 1.0) -> None:
        """Fold in what Prometheus has firing now and what the webhook received."""
        now = time.time()
        if now - self._polled >= every_s:
            self._polled = now
            try:
                with urllib.request.urlopen(f"{self.prom_url}/api/v1/alerts", timeout=5) as r:
                    alerts = json.load(r)["data"]["alerts"]
            except (OSError, ValueError, KeyError):
                alerts = []
            for a in alerts:
                if a.get("state") == "firing":
                    s = self._seen(a["labels"])
                    if s.fired is None:
                        s.fired = now
        with self.receiver.lock:
            new = self.receiver.deliveries[self._read :]
            self._read = len(self.receiver.deliveries)
        for at, doc in new:
            for a in doc.get("alerts") or []:
                s = self._seen(a.get("labels") or {})
                if a.get("status") == "firing" and s.delivered is None:
                    s.delivered = at
                elif a.get("status") == "resolved" and s.resolved is None:
                    s.resolved = at

    def _seen(self, labels: dict[str, str]) -> Seen:
        key = alert_key(labels)
        if key not in self.seen:
            self.seen[key] = Seen(labels=dict(labels))
        return self.seen[key]

    def open_alerts(self) -> list[Seen]:
        """Alerts that fired (or were delivered) and whose resolution has not arrived."""
        return [s for s in self.seen.values()
                if (s.fired or s.delivered) and s.resolved is None]  # fmt: skip

    def take_view(self, since: float) -> list[dict[str, Any]]:
        """The alerts so far, measured from `since`, forgetting nothing."""
        return [s.entry(since) for s in self.seen.values()]

    def take(self, since: float) -> list[dict[str, Any]]:
        """The alerts of one fault (measured from `since`), and forget the resolved ones so
        the next fault starts clean; one still open is carried into the next."""
        out = [s.entry(since) for s in self.seen.values()]
        self.seen = {k: s for k, s in self.seen.items() if s.resolved is None}
        return sorted(out, key=lambda e: (e["fired_after_s"] is None, e["fired_after_s"] or 0))

    def stop(self) -> None:
        for p in (self.prometheus, self.alertmanager):
            if p is not None:
                p.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
