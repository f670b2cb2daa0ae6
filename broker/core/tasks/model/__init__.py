"""What a task and a function are, and the pure rules over them: a task and the one table of
its moves (task.py), a request task's own request (requests.py), a function's spec and the
API's policy (spec.py), the functions by name (functions.py), an enqueue's options
(options.py), and what a call's outcome does to its task (outcomes.py).  No state of the
store lives here; the components (../components/) and the store (../store.py) build on it."""
