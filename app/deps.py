"""Dependencies injected into routes."""
from __future__ import annotations

from fastapi import Request

from .service import AttentionService
from .settings import Settings


def get_service(request: Request) -> AttentionService:
    return request.app.state.service


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings
