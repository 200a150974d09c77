"""A FastAPI app that enqueues pgqueue tasks in its requests' transactions.

- ``POST /orders`` inserts an order and enqueues its confirmation email through the request's
  ``AsyncSession``, in one transaction: if anything after the enqueue fails (here, a declined
  payment), neither the order nor the task exists, and no email goes out for it.
- ``GET /orders/{id}/confirmation?wait=10`` waits (up to 10 s) for the worker's result.
- pgqueue's HTTP API and dashboard are mounted under ``/queue``, behind this app's own login
  (HTTP Basic here; put your own check in ``StaffOnly``).

Run it (see README.md beside this file)::

    export PGQUEUE_DATABASE_URL=postgresql://localhost/shop ADMIN_PASSWORD=s3cret
    pgqueue migrate
    pgqueue worker examples.fastapi_app.tasks:tasks          # one terminal
    uvicorn --factory examples.fastapi_app.app:create_app    # another
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from pydantic import BaseModel
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

import pgqueue
import pgqueue.aio
import pgqueue.api

from .tasks import send_confirmation


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    item: Mapped[str]
    quantity: Mapped[int]
    confirmation_task: Mapped[uuid.UUID | None]


class NewOrder(BaseModel):
    email: str
    item: str
    quantity: int = 1
    payment: str  # a payment provider's token, e.g. "tok_visa"


class OrderCreated(BaseModel):
    id: int
    task_id: uuid.UUID


class Confirmation(BaseModel):
    order_id: int
    status: str  # queued, running, completed, failed or cancelled
    result: Any = None


class PaymentDeclined(Exception):
    pass


def charge(payment: str, order: Order) -> None:
    """Stands in for your payment provider (its test token "tok_chargeDeclined" is declined)."""
    if payment == "tok_chargeDeclined":
        raise PaymentDeclined(f"order {order.id}: the card was declined")


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session:
        yield session


DbSession = Annotated[AsyncSession, Depends(get_session)]
router = APIRouter()


@router.post("/orders", status_code=201)
async def create_order(new: NewOrder, session: DbSession) -> OrderCreated:
    try:
        async with session.begin():  # commits at the end of the block, or rolls back
            order = Order(email=new.email, item=new.item, quantity=new.quantity)
            session.add(order)
            await session.flush()  # the order's id, for the task
            handle = await send_confirmation.aenqueue(session, order.id, new.email)
            order.confirmation_task = handle.id
            charge(new.payment, order)  # raising here rolls back the order and its task
    except PaymentDeclined as exc:
        raise HTTPException(402, str(exc)) from None
    # Committed: workers see the task now (and were woken by a NOTIFY at the commit).
    return OrderCreated(id=order.id, task_id=handle.id)


@router.get("/orders/{order_id}/confirmation")
async def get_confirmation(
    order_id: int, session: DbSession, wait: Annotated[float, Query(ge=0, le=30)] = 0
) -> Confirmation:
    async with session.begin():
        order = await session.get(Order, order_id)
    if order is None or order.confirmation_task is None:
        raise HTTPException(404, f"no order {order_id}")
    # Outside the transaction, which has ended: a wait inside one could never end, since
    # PostgreSQL delivers the notification that ends it only between transactions.
    if wait:
        try:
            task = await pgqueue.aio.wait(session, order.confirmation_task, timeout=wait)
        except pgqueue.WaitTimeout as exc:  # not finished yet: say how it stands
            task = exc.task
    else:
        task = await pgqueue.aio.get_task(session, order.confirmation_task)
    return Confirmation(order_id=order_id, status=task.status.value, result=task.result)


class StaffOnly:
    """This app's login in front of a mounted ASGI app. A FastAPI dependency does not reach
    into a mount, so the check wraps the mounted app itself. HTTP Basic suits the dashboard:
    the browser asks for the password once and sends it with the page's API calls too."""

    def __init__(self, app: ASGIApp, username: str, password: str) -> None:
        self.app = app
        self.expected = f"{username}:{password}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.allowed(scope):
            refusal = PlainTextResponse(
                "Unauthorized", 401, headers={"WWW-Authenticate": 'Basic realm="queue"'}
            )
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def allowed(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, encoded = header.partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            given = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            return False
        return secrets.compare_digest(given, self.expected)


def create_app(database_url: str | None = None, admin_password: str | None = None) -> FastAPI:
    url = database_url or os.environ["PGQUEUE_DATABASE_URL"]
    password = admin_password or os.environ["ADMIN_PASSWORD"]
    # One URL for the app, the worker and pgqueue's API; SQLAlchemy wants its driver named.
    engine = create_async_engine(make_url(url).set(drivername="postgresql+psycopg"))
    # No tokens of its own: StaffOnly below is its authentication, for requests from anywhere
    # (allow_unauthenticated) sent to any of this app's names (allowed_hosts "*": a page that
    # rebinds its own name to this server cannot present the staff login, which the browser
    # keeps for this app's origin).
    queue = pgqueue.api.create_app(
        pgqueue.api.ApiSettings(
            database_url=url, allow_unauthenticated=True, allowed_hosts=frozenset({"*"})
        )
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:  # a real app runs its migrations instead
            await conn.run_sync(Base.metadata.create_all)
        # A mounted app gets no lifespan events: run pgqueue's (its connection pool) here.
        async with queue.router.lifespan_context(queue):
            yield
        await engine.dispose()

    app = FastAPI(title="shop", lifespan=lifespan)
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    app.include_router(router)
    app.mount("/queue", StaffOnly(queue, "admin", password))
    return app
