"""The routes, a module per resource: an APIRouter each for tasks, dead letters, schedules,
queues, limits, stats and failures (under /api/v1); and the Prometheus metrics, the
dashboard's files and the health checks outside it, which are the app's own routes (see
:mod:`pgqueue.api.routes.health`).

``pgqueue.api.app`` includes them in a fixed order, which is the order of the paths in the
OpenAPI document. The routers are built once per process and shared by every app; what
differs between apps (the database, the tokens) comes from the app's state and from the
dependencies ``create_app`` gives the /api/v1 routes.
"""

# On each /api/v1 router itself, not given to include_router: the route template in the
# request metrics (and the scope's "route") is the path the route was declared with.
V1 = "/api/v1"
