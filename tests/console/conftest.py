import pytest
from django.test import Client


@pytest.fixture
def staff_client(django_user_model) -> Client:
    """A browser session of a staff member (the console's pages are for staff)."""
    client = Client()
    client.force_login(django_user_model.objects.create_user("ops", password="pw-ops-long-enough", is_staff=True))
    return client
