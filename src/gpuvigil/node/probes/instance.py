"""Which instance type this node is: the config's `node.instance_type`, else the DMI
product name (AWS Nitro reports the instance type there, e.g. `p5.48xlarge`; DGX systems
report `DGX H100`). Called by the fabric check, preflight and anyone needing the catalog.
"""

from __future__ import annotations

from gpuvigil.node.catalog.instances import InstanceCatalog, InstanceType, load_catalog
from gpuvigil.node.checks import CheckContext

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


def catalog(ctx: CheckContext) -> InstanceCatalog:
    """The catalog with this config's overrides, cached per context (it is validated once)."""
    cached = ctx.extras.get("instance.catalog")
    if cached is None:
        fabric = getattr(ctx.config, "fabric", None)
        cached = load_catalog(getattr(fabric, "instances", None) or None)
        ctx.extras["instance.catalog"] = cached
    return cached


def lookup(ctx: CheckContext) -> tuple[str | None, tuple[str, InstanceType] | None]:
    """(the detected name, its catalog entry or None)."""
    name = detect(ctx)
    return name, catalog(ctx).lookup(name)
