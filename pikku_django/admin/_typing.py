"""What the admin's mixins are typed against: ``ModelAdmin`` for the type checker,
``object`` at run time (each admin that uses a mixin puts ``ModelAdmin`` after it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.contrib import admin

    AdminMixin = admin.ModelAdmin[Any]
else:
    AdminMixin = object

__all__ = ["AdminMixin"]
