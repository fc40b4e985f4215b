"""label-rbac: a validating admission webhook that narrows RBAC grants by object labels."""

__version__ = "0.3.8"
