"""Where the RBAC state comes from: static files or a live cluster, behind one interface."""

from app.source.base import RbacSource, SourceStatus

__all__ = ["RbacSource", "SourceStatus"]
