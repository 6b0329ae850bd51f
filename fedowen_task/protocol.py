"""The message protocol a ClientApp and the server share (besides Flower's own records).

A ClientApp names itself in a ConfigRecord :data:`CLIENT_RECORD_KEY` of every reply (train
and query): :data:`CLIENT_ID_FIELD` holds its stable client id (``partition-id`` in
simulation, a node-config ``client-id`` in deployment), and on a Ray cluster
:data:`RAY_NODE_FIELD` the Ray node it ran on. The strategy reads them
(:mod:`fedowen_strategy.replies`); the ClientApp writes them (:mod:`client_app.app`).
"""

from __future__ import annotations

#: Key of the ConfigRecord in which a ClientApp names itself.
CLIENT_RECORD_KEY = "client"
#: Field of that record holding the stable client id (partition-id or a node-config id).
CLIENT_ID_FIELD = "client-id"
#: Field of that record naming the Ray node a simulated client ran on (absent outside Ray).
RAY_NODE_FIELD = "ray-node"
#: Train- or query-config field asking a client for the local loss of the model sent with a
#: query (Power-of-Choice's candidates), and the reply's metric holding it.
LOCAL_LOSS_FIELD = "local-loss"
#: Train-config field asking a client to report the sum of its squared per-sample training
#: losses (Oort's statistical utility), and the reply's metric holding it.
LOSS_SQUARES_FIELD = "loss-squares"
#: Train-config field asking a client to report the variance of its stochastic gradients along
#: its local steps (DELTA's local variance sigma^2: the mean squared norm of the per-step
#: gradients minus the squared norm of their mean), and the reply's metric holding it.
GRAD_VARIANCE_FIELD = "grad-variance"
#: Train-config field asking a client for its step scale (sent with :data:`GRAD_VARIANCE_FIELD`
#: too), and the reply's metric holding it: how far a constant unit gradient would have moved
#: the client's model (:func:`fedowen_task.training.step_scale`; the server divides an update
#: by it to estimate the client's mean gradient).
STEP_SCALE_FIELD = "step-scale"
#: Reply metric holding a client's number of examples, in its train reply (Flower's strategies
#: weight by it, their ``weighted_by_key`` default; DELTA, HiCS-FL and Oort read it) and in its
#: reply to the local-loss query (Power-of-Choice's record).
NUM_EXAMPLES_FIELD = "num-examples"
#: Train-reply metric that is 1 for every client: Flower's strategies weight by it
#: (``strategy-params = "weighted_by_key=unit-weight"``) to average with equal weights instead
#: of sample counts (``num-examples``, their default).
UNIT_WEIGHT_FIELD = "unit-weight"
#: Name endings of a normalisation layer's running statistics (torch's ``_NormBase`` buffers):
#: averaged but not part of an update (:mod:`fedowen_strategy.updates`), and left as the global
#: model's by the simulated noise attacker (a negative variance would only get it rejected).
NORM_STATISTICS = ("running_mean", "running_var")
