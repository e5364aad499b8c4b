"""A fleet of serving replicas on a simulated clock: routing, prefix caches per replica, autoscaling.

Each replica is the engine's own scheduler and block manager (labs/engine), timed by the serving
simulator's roofline (labs/serving_sim) slowed to what the engine measured on an H200
(labs/results/engine.json). In the order a run uses them:

* ``trace``: the stored multi-turn chat trace and the day-shaped load (labs/data/fleet_trace.yaml).
* ``calibration``: the engine's measured efficiencies, read once, and the clock built from them.
* ``fleet``: replicas, routers, the autoscaler and the event loop.
* ``scenarios``: the two experiments; ``cli`` prints them and records them; ``report`` renders
  labs/results/fleet.json on the site.

Run ``python -m labs.fleet --help``. Every number is derived, not measured.
"""
