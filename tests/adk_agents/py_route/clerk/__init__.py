"""A fixture agent for the api_server tests."""

from . import agent as agent
