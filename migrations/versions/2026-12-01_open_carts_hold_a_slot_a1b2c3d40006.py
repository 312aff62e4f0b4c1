"""every open cart holds a slot (the contract step of a1b2c3d40005's open-cart slots)

Revision ID: a1b2c3d40006
Revises: a1b2c3d40005
Create Date: 2026-12-01 12:00:00.000000

a1b2c3d40005 added ``cart.open_slot`` as a nullable column (expand) and numbered the open carts there
were. While it rolled out, replicas still running the older code kept creating open carts without a
slot. Those carts escape MAX_OPEN_CARTS: ``cart_create`` looks for a free slot, a cart with no slot
takes none, and the unique index ignores NULLs. This migration gives each such cart the lowest slots
its owner has free, then adds a CHECK, so no open cart can be without a slot again.

Run it only once no replica older than a1b2c3d40005's code is left (docs/deployment.md, "Contract"):
that code's ``cart_create`` writes no slot, and the CHECK refuses it.

The table is locked for the migration's short transaction (backfill and the CHECK's scan), so no
``cart_create`` can take a slot the backfill is handing out. Downgrading drops the CHECK and keeps
the slots, which the older schema allows.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "a1b2c3d40006"
down_revision: str | None = "a1b2c3d40005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN_HOLDS_SLOT = "open_holds_slot"


def upgrade() -> None:
    # ACCESS EXCLUSIVE at once, as ADD CONSTRAINT would take: starting lower and upgrading could deadlock
    # with a request that reads a cart and then writes it.
    op.execute("LOCK TABLE cart IN ACCESS EXCLUSIVE MODE")
    # A slotless open cart takes its owner's n-th free slot, oldest cart first. The first (slotted + slotless)
    # numbers hold enough free ones: at most `slotted` of them are taken. An owner already past the cap
    # keeps every cart and just cannot create more.
    op.execute(
        """
        WITH slotless AS (
            SELECT id, principal_iss, principal_sub,
                   row_number() OVER (PARTITION BY principal_iss, principal_sub ORDER BY created_at, id) AS n
            FROM cart WHERE status = 'open' AND open_slot IS NULL
        ), owners AS (
            SELECT principal_iss, principal_sub, count(*) AS slotless,
                   (SELECT count(*) FROM cart
                    WHERE cart.principal_iss = slotless.principal_iss AND cart.principal_sub = slotless.principal_sub
                      AND cart.status = 'open' AND cart.open_slot IS NOT NULL) AS slotted
            FROM slotless GROUP BY principal_iss, principal_sub
        ), free AS (
            SELECT owners.principal_iss, owners.principal_sub, slot,
                   row_number() OVER (PARTITION BY owners.principal_iss, owners.principal_sub ORDER BY slot) AS n
            FROM owners, generate_series(1, owners.slotted + owners.slotless) AS slot
            WHERE NOT EXISTS (
                SELECT FROM cart
                WHERE cart.principal_iss = owners.principal_iss AND cart.principal_sub = owners.principal_sub
                  AND cart.status = 'open' AND cart.open_slot = slot)
        )
        UPDATE cart SET open_slot = free.slot
        FROM slotless
        JOIN free ON free.principal_iss = slotless.principal_iss AND free.principal_sub = slotless.principal_sub
                 AND free.n = slotless.n
        WHERE cart.id = slotless.id
        """
    )
    op.create_check_constraint(op.f(f"ck_cart_{OPEN_HOLDS_SLOT}"), "cart", "status <> 'open' OR open_slot IS NOT NULL")


def downgrade() -> None:
    op.drop_constraint(op.f(f"ck_cart_{OPEN_HOLDS_SLOT}"), "cart", type_="check")
