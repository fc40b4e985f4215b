# label-rbac webhook image: python -m app serve (gunicorn, TLS).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /srv
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY app ./app
COPY manifests/examples ./manifests/examples

# Any non-root uid; the Deployment sets runAsNonRoot.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["python", "-m", "app"]
CMD ["serve", "--rbac-dir", "manifests/examples", "--dev-tls", "/tmp/dev-certs"]
