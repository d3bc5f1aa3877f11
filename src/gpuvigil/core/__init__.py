"""The few types every layer shares. Imports nothing else of gpuvigil's."""

from gpuvigil.core.conditions import Condition
from gpuvigil.core.findings import Action, CheckRun, Finding, NodeReport, Status, utcnow

__all__ = ["Action", "CheckRun", "Condition", "Finding", "NodeReport", "Status", "utcnow"]
