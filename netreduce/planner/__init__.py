"""GRID-style gradient routing: a topology, a job's chunks, and where each chunk is
summed. Core code: numpy and scipy only (``pip install netreduce[planner]``).
docs/planner.md describes the topology file and the policies."""
from netreduce.planner.placement import POLICIES, Placement, policy
from netreduce.planner.problem import Job, Leg, Problem, split_chunks
from netreduce.planner.topology import PlannerError, Topology, from_dict, load, spine_leaf

__all__ = ["POLICIES", "Job", "Leg", "Placement", "PlannerError", "Problem", "Topology",
           "from_dict", "load", "policy", "spine_leaf", "split_chunks"]
