#!/usr/bin/env bash
# The real Search-R1 data, for a machine with the network (never run by the tests or run_local.sh):
# the 2018 Wikipedia corpus (21 M passages) and the NQ + HotpotQA questions, as v1.0 uses them,
# converted to what this example reads.
#   examples/search_r1/data_process.sh [OUT_DIR]          # default examples/search_r1/data/wiki
# Then:
#   CORPUS=OUT_DIR/wiki-18.jsonl examples/search_r1/run_local.sh \
#       --train-file OUT_DIR/train.jsonl --val-file OUT_DIR/test.jsonl --model PATH
# BM25 over the full corpus takes (an estimate, not measured here) tens of GB of memory and a while
# to index at start; the dense option of retrieval_server.py ranks with numpy (fine to about a
# million passages). For the full
# corpus with E5 + FAISS, run v1.0's / Search-R1's retrieval_server.py on the index downloaded
# below: it answers the same /retrieve requests, so the agent works with it unchanged.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$HERE/data/wiki}"
PYTHON="${PYTHON:-$HERE/../../.venv/bin/python}"
HF=https://huggingface.co/datasets/PeterJinGo
mkdir -p "$OUT"
cd "$OUT"

wget -c "$HF/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz"
[[ -f wiki-18.jsonl ]] || gzip -dk wiki-18.jsonl.gz          # {"id", "contents": "\"Title\"\ntext"}
wget -c "$HF/nq_hotpotqa_train/resolve/main/train.parquet"
wget -c "$HF/nq_hotpotqa_train/resolve/main/test.parquet"
if [[ "${WITH_E5_INDEX:-0}" == 1 ]]; then                      # 60+ GB: for the FAISS server only
  wget -c "$HF/wiki-18-e5-index/resolve/main/part_aa"
  wget -c "$HF/wiki-18-e5-index/resolve/main/part_ab"
  cat part_aa part_ab >e5_Flat.index
fi

# The question rows as this example's jsonl: id, question, golden_answers (a list), data_source.
"$PYTHON" - <<'PY'
import json
import pyarrow.parquet as pq

for split in ("train", "test"):
    rows = pq.read_table(f"{split}.parquet").to_pylist()
    with open(f"{split}.jsonl", "w") as f:
        for n, row in enumerate(rows):
            out = {
                "id": str(row.get("id", f"{split}-{n}")),
                "question": row["question"],
                "golden_answers": list(row["golden_answers"]),
                "data_source": row.get("data_source", ""),
            }
            f.write(json.dumps(out, ensure_ascii=False) + "\n")
    print(f"{split}.jsonl: {len(rows)} questions")
PY
