"""``pk__any=[…]``: membership in a list as ONE array parameter on PostgreSQL.

``pk__in=[…]`` renders one placeholder per value, so every batch has a different statement
text: psycopg converts it client-side without its query cache and PostgreSQL plans it anew
(19% of the relay's time in issue 13's profile). ``= ANY(%s::bigint[])`` with the array's
text is one statement text whatever the batch size. Other databases get the ``IN`` list.
"""

from __future__ import annotations

from typing import Any

from django.db.models import ForeignKey, IntegerField, Lookup


@IntegerField.register_lookup
class AnyLookup(Lookup):
    lookup_name = "any"
    prepare_rhs = False

    def get_prep_lookup(self) -> list[int]:
        return [int(v) for v in self.rhs]

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        values = list(self.rhs)
        if connection.vendor == "postgresql":
            # The array as its text form: psycopg adapts a list of ints one element at a time
            # in Python (~1 µs each, thousands per relay batch); the values are ints already.
            literal = "{" + ",".join(map(str, values)) + "}"
            return f"{lhs} = ANY(%s::bigint[])", (*lhs_params, literal)
        if not values:
            return "1 = 0", tuple(lhs_params)
        return f"{lhs} IN ({', '.join(['%s'] * len(values))})", (*lhs_params, *values)


# ``entry_id__any=[…]`` on a foreign key's column as well.
ForeignKey.register_lookup(AnyLookup)
