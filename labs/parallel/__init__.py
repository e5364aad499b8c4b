"""Multi-GPU lab: tensor parallelism across processes, collectives, MoE routing, a parallelism planner.

Torch-free (the site build imports them): alphabeta (the alpha-beta collective
model and the interconnect data), comm (bytes per token of TP, PP and EP),
plan (the planner), report (the page macros). Everything else needs torch.
"""
