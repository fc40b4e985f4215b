"""The compiled path: the parameter compiler, the generated ValidatingAdmissionPolicies
and the webhook registration it keeps off the resources they judge."""
