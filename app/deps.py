"""Dependencies injected into routes."""
from __future__ import annotations

from fastapi import Request

from .service import AttentionService


def get_service(request: Request) -> AttentionService:
    return request.app.state.service
