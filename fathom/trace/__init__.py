"""`fathom trace`: where one packet goes through the cloud, switch by switch and stage by stage.

The simulated trace (`trace`) walks a packet through the *desired* tables of every switch it
reaches (fathom.trace.walk) with an OpenFlow interpreter over fathom's own flows
(fathom.trace.tables). Pure, like the compilers: it reads the model and the compiled states only.
Given `actual`, the same walk reads each node's own tables from `ovs-appctl ofproto/trace` run by
the node's agent (fathom.trace.ofproto reads its output). fathom.trace.svg draws a trace.
docs/trace.md says how to read a trace.
"""
from fathom.trace.walk import TraceError, Unanswered, trace  # noqa: F401
