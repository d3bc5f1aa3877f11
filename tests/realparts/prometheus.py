"""A real Prometheus server scraping given targets on loopback.

Target discovery batches every 5 s, so the first sample appears ~6 s after start: poll
`query()` rather than sleeping.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from realparts.procs import Proc, free_port, wait_until


def available() -> tuple[bool, str]:
    if shutil.which("prometheus") is None:
        return False, "prometheus not installed (Debian prometheus)"
    return True, ""


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str], *, scrape_interval_s: float = 1) -> None:
        self.dir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = targets
        self.scrape_interval_s = scrape_interval_s
        self.proc: Proc | None = None

    def start(self, rule_files: list[Path] | None = None) -> None:
        cfg = self.dir / "prometheus.yml"
        rules = "".join(f"  - {p}\n" for p in rule_files or [])
        cfg.write_text(
            f"""global:
  scrape_interval: {self.scrape_interval_s}s
  evaluation_interval: {self.scrape_interval_s}s
rule_files:
{rules or "  []"}
scrape_configs:
  - job_name: gpuvigil
    static_configs:
      - targets: {json.dumps(self.targets)}
"""
        )
        self.proc = Proc(
            [
                "prometheus",
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            log=self.dir / "prometheus.log",
        )
        wait_until(self._ready, timeout=30, what="prometheus /-/ready")

    def _ready(self) -> bool:
        assert self.proc is not None
        if not self.proc.alive():
            raise RuntimeError("prometheus exited:\n" + self.proc.log_tail())
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
            return r.status == 200

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=5) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r} failed: {body}")
        return body["data"]["result"]

    def wait_for(self, expr: str, *, timeout: float = 30) -> list[dict[str, Any]]:
        box: dict[str, list[dict[str, Any]]] = {}

        def has() -> bool:
            box["r"] = self.query(expr)
            return bool(box["r"])

        wait_until(has, timeout=timeout, interval=0.5, what=f"prometheus result for {expr!r}")
        return box["r"]

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()


def make_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="gpuvigil-prom-"))
