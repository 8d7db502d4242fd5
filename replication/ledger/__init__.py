"""The ledger: every notebook's claims and figures gathered into the index, the report and the forest plot
(report, table, forest), a run compared with another (compare), the rerun projection (seeds), the committed
digests (digests), the README's results at a glance (glance) and the provenance stamp of each run (provenance)."""
