"""The background audit as policy reports (``label-rbac report``)."""
