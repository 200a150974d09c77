from django.db import transaction
from django.http import HttpRequest, JsonResponse

from pgqueue.contrib.django.compat import TaskResultDoesNotExist
from shop.models import Order
from shop.tasks import process_order


class Rollback(Exception):
    pass


def place_order(request: HttpRequest) -> JsonResponse:
    """Saves an order and enqueues its processing in one transaction; ``fail=1`` makes the
    transaction roll back after the enqueue."""
    task_id = None
    try:
        with transaction.atomic():
            order = Order.objects.create(item=request.POST["item"])
            task_id = process_order.enqueue(order.id).id
            if request.POST.get("fail"):
                raise Rollback
    except Rollback:
        return JsonResponse({"task_id": task_id, "rolled_back": True})
    return JsonResponse({"task_id": task_id, "order_id": order.id, "rolled_back": False})


async def task_status(request: HttpRequest, task_id: str) -> JsonResponse:
    try:
        result = await process_order.aget_result(task_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"error": "not found"}, status=404)
    body: dict[str, object] = {"status": result.status, "attempts": result.attempts}
    if result.status == "SUCCESSFUL":
        body["return_value"] = result.return_value
    return JsonResponse(body)
