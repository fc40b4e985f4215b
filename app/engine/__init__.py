"""The pure decision engine: no Flask, no kubernetes client, no I/O.

Everything here takes plain data (an admission ``Request`` and an RBAC ``Snapshot``)
and returns a frozen ``Decision``.
"""
