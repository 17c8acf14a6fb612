"""torchyard's serving runtime: what runs inside an OnlineEndpoint's serving Pods.

The guide's scoring-script contract (``init()``, ``run(raw_data)``, ``AZUREML_MODEL_DIR``,
``POST /score``) and the Open Inference Protocol (KServe's V1 and V2 routes) on Starlette
and Uvicorn. The modules, by concern:

- ``contract``: ports, routes and variables the Pod's builder (``planning.endpoints``) and
  the runtime share (standard library only: ``planning`` imports it);
- ``scoring``: the entry script and the threads that call ``run()`` within a time;
- ``protocols``: V1 and V2 requests and answers over ``run()``;
- ``auth``: callers' tokens, checked by the registry service and cached;
- ``app``: the Starlette application (routes, limits, metrics); ``draining``: Uvicorn's
  server with a drain on SIGTERM; ``server``: the process (``python -m torchyard.serving``);
- ``prepare``: the init container that copies the runtime and its libraries into the Pod.

This face imports nothing: ``planning`` reads ``contract`` without loading Starlette.
"""
