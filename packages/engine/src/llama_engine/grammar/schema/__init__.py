"""JSON schema -> GBNF grammar (llama.cpp's `json_schema_to_grammar`), regular expressions included.

>>> print(json_schema_to_grammar({"type": "boolean"}), end="")
root ::= ("true" | "false")
space ::= | " " | "\\n"{1,2} [ \\t]{0,20}
"""

from .converter import json_schema_to_grammar
from .rules import SchemaError

__all__ = ["SchemaError", "json_schema_to_grammar"]
