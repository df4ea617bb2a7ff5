"""PPTMon: per-VNF and end-to-end packet processing time carried in-band, as in the PPTMon paper
(docs/papers.md).

The data plane is eBPF (native/pptmon); this package holds the Python side: the wire
format reference (wire), the native tools (native), statistics over records (stats),
the lab chain of VNF namespaces (chain) and the control of the loaders (control).
"""
