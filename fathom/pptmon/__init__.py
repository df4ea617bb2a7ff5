"""PPTMon: per-VNF and end-to-end packet processing time carried in-band, as in the PPTMon paper
(docs/papers.md).

The data plane is eBPF (native/pptmon); this package holds the Python side: the wire
format reference (wire), the native tools (native), statistics over records (stats),
the lab chain of VNF namespaces (chain) and the control of the loaders (control).
"""

# Most records one ingestion call takes (fathom.pptmon.records; the agent's batches): here, so the
# agent knows it without importing the records' schema (pydantic) before any record flows.
MAX_BATCH = 1000
