"""Which instance type this node is: the config's `node.instance_type`, else the DMI
product name (AWS Nitro reports the instance type there, e.g. `p5.48xlarge`; DGX systems
report `DGX H100`). Called by the fabric check, preflight and anyone needing the catalog.
"""

from __future__ import annotations

import json

from gpuvigil.node.catalog.instances import InstanceCatalog, InstanceType, load_catalog
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.fabric.readings import NodeInstance

DMI_PRODUCT = "sys/devices/virtual/dmi/id/product_name"


def detect(ctx: CheckContext) -> str | None:
    """The configured instance type, else the DMI product name, else None."""
    configured = getattr(ctx.config, "instance_type", None)
    if configured:
        return str(configured)
    try:
        text = ctx.path(DMI_PRODUCT).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return text or None


_catalogs: dict[str, InstanceCatalog] = {}


def catalog(ctx: CheckContext) -> InstanceCatalog:
    """The catalog with this config's overrides, validated once per distinct override."""
    fabric = getattr(ctx.config, "fabric", None)
    overrides = getattr(fabric, "instances", None) or None
    key = json.dumps(overrides, sort_keys=True, default=str)
    cached = _catalogs.get(key)
    if cached is None:
        cached = _catalogs[key] = load_catalog(overrides)
    return cached


def lookup(ctx: CheckContext) -> tuple[str | None, tuple[str, InstanceType] | None]:
    """(the detected name, its catalog entry or None)."""
    name = detect(ctx)
    return name, catalog(ctx).lookup(name)


def node_instance(ctx: CheckContext) -> NodeInstance:
    """This node's instance type as a fact for the rules."""
    name, entry = lookup(ctx)
    return NodeInstance(name, entry, configured=bool(getattr(ctx.config, "instance_type", None)))
