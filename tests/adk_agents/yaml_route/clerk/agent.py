"""An agent that is only loaded, never run: the tests create sessions over HTTP."""

from google.adk.agents import LlmAgent

root_agent = LlmAgent(name="clerk", model="gemini-2.0-flash", instruction="Say hi.")
