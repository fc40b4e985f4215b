# helm test: the webhook refuses an unlabeled ConfigMap to a ServiceAccount whose one grant is
# label-restricted, and allows a labeled one (server-side dry runs: nothing is stored). Retried
# for a minute while the webhook's cache learns the test's Role.
import sys
import time

from kubernetes import client, config

namespace = sys.argv[1]
config.load_config()
api = client.CoreV1Api()


def create(labels):
    body = {"metadata": {"name": "label-rbac-helm-test", "labels": labels}}
    try:
        api.create_namespaced_config_map(namespace, body, dry_run="All")
    except client.ApiException as exc:
        return f"{exc.status} {exc.body}"
    return ""


deadline = time.monotonic() + 60
while True:
    refused = create({})
    if refused.startswith("403") and "denied" in refused:
        break
    if time.monotonic() > deadline:
        sys.exit(f"an unlabeled ConfigMap was not refused by label-rbac: {refused or 'created'}")
    time.sleep(2)
print(f"refused as expected: {refused}")
allowed = create({"labelrbac.io/test": "allowed"})
if allowed:
    sys.exit(f"a ConfigMap labeled as the Role allows was refused: {allowed}")
print("a labeled ConfigMap allowed")
