"""/api/v1/workflows: a workflow's status and tasks, and cancelling it."""

from __future__ import annotations

from fastapi import APIRouter, Response

from pgqueue import aio
from pgqueue.api.dependencies import AppState
from pgqueue.api.errors import COMMON, responses
from pgqueue.api.routes import V1, Route
from pgqueue.api.schemas import WorkflowOut

router = APIRouter(prefix=V1, route_class=Route)


@router.get(
    "/workflows/{workflow_id}", response_model=WorkflowOut, responses=responses(404, *COMMON)
)
async def get_workflow(workflow_id: str, state: AppState) -> WorkflowOut:
    """A workflow's status (derived from its tasks), counts by task status, its tasks in
    build order with their parents and children, and its final result."""
    async with state.connection() as conn:
        return WorkflowOut.of(await aio.workflow(conn, workflow_id))


@router.delete(
    "/workflows/{workflow_id}",
    response_model=WorkflowOut,
    responses={
        202: {
            "model": WorkflowOut,
            "description": "Some tasks were running: their cancellation was requested; their "
            "handlers decide, and the workflow is final once they end",
        },
        **responses(404, *COMMON),
    },
)
async def cancel_workflow(workflow_id: str, response: Response, state: AppState) -> WorkflowOut:
    """Cancel every task of the workflow that has not finished: 200 when none is left
    running (waiting and queued ones are cancelled at once; a finished workflow is
    unchanged); 202 when running ones were asked to stop."""
    async with state.connection() as conn:
        info = await aio.cancel_workflow(conn, workflow_id)
    if not info.status.is_final:
        response.status_code = 202
    return WorkflowOut.of(info)
