#!/usr/bin/env bash
# A tool's view of the appliance: upload a document, wait until it is ready, ask for a summary
# and stream it as it is written. Needs curl and python3 (for reading JSON).
#
#   APPLIANCE_URL=http://appliance.internal:8000 APPLIANCE_TOKEN=dapp_… docs/api-example.sh contract.pdf
set -euo pipefail

URL="${APPLIANCE_URL:-http://127.0.0.1:8000}"
TOKEN="${APPLIANCE_TOKEN:?create a token with the read and write scopes under API tokens}"
FILE="${1:?usage: $0 FILE}"
AUTH=(-H "Authorization: Bearer $TOKEN")
field() { python3 -c "import json, sys; v = json.load(sys.stdin)$1; print(v if isinstance(v, str) else json.dumps(v))"; }

# 1. Upload (multipart). The same file uploaded again returns the same document.
document=$(curl -sS --fail-with-body "${AUTH[@]}" -F "file=@$FILE" "$URL/api/v1/documents")
id=$(field '["id"]' <<<"$document")
echo "document $id uploaded" >&2

# 2. Wait until its text is extracted and indexed.
for _ in $(seq "${SUMMARY_MAX_WAIT_S:-600}"); do
  state=$(curl -sS --fail-with-body "${AUTH[@]}" "$URL/api/v1/documents/$id" | field '["state"]')
  [ "$state" = ready ] && break
  [ "$state" = failed ] && { echo "ingestion failed" >&2; exit 1; }
  sleep 1
done
[ "$state" = ready ] || { echo "document $id is still $state" >&2; exit 1; }

# 3. Ask for a summary. The Idempotency-Key makes a retried request return the same job.
job=$(curl -sS --fail-with-body "${AUTH[@]}" -H "Content-Type: application/json" \
  -H "Idempotency-Key: summary-of-$id" \
  -d "{\"document_id\": $id, \"length\": \"short\"}" "$URL/api/v1/jobs/summary")
job_id=$(field '["id"]' <<<"$job")
echo "job $job_id queued" >&2

# 4. Stream it: `queue` events while it waits, `delta` events as text is written, then `done`.
curl -sS -N --fail-with-body "${AUTH[@]}" "$URL/api/v1/jobs/$job_id/stream"

# 5. The finished job: text, pages of its statements, TTFT and tokens/s.
curl -sS --fail-with-body "${AUTH[@]}" "$URL/api/v1/jobs/$job_id" | field '["metrics"]' >&2
