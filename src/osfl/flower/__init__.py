"""osfl over Flower (Beutel et al., "Flower: A Friendly Federated Learning
Research Framework", 2020; ``flwr`` 1.x Message API): the adapter layer
between osfl's FL core and Flower. Everything in osfl that imports ``flwr``
lives here or in :mod:`osfl.flower_app`; nothing in :mod:`osfl.fl` imports it.

- :mod:`.records`: osfl's safetensors messages inside Flower records;
- :mod:`.spec`: the :class:`~osfl.flower.spec.JobSpec` both sides build a job from;
- :mod:`.client`: the ClientApp (``make_client_app``);
- :mod:`.discovery`, :mod:`.claims`: before round 0, which node plays which
  client (a site registry, run config ``keep-node``; never the first answer);
- :mod:`.grid`: the round loop's transport over a ServerApp's ``Grid``
  (:class:`~osfl.flower.grid.FlowerGridRuntime`);
- :mod:`.secagg_client`, :mod:`.secagg_server`: the SecAgg+ transport;
- :mod:`.loopback`: an in-process Grid over Flower's wire encoding
  (``runtime=flower``);
- :mod:`.engine`: Flower's simulation engine (``runtime=flower_engine``);
- the apps a deployment loads and the tools around them are
  :mod:`osfl.flower_app`, a package of the top layer (they build jobs through
  the assembly, so they cannot sit on this floor).
"""
