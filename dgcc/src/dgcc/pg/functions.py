"""The five TPC-C transactions as PL/pgSQL functions, with dgcc's procedure semantics.

One function call is one transaction (the client runs in autocommit mode). They follow
``dgcc.workloads.tpcc.procedures`` column by column: money in cents, the same stock-level rule,
the same total-amount rounding, the same C_DATA prefix for bad credit, the by-last-name
customer as the middle one (rounded up) in (C_FIRST, C_ID) order, and NewOrder's item check
*before* any write, raising SQLSTATE ``DG001`` (the spec's 1% rollback). PostgreSQL runs at its
default READ COMMITTED isolation, the read-only functions STABLE (one snapshot per call, as
dgcc gives each transaction one point in the serial order); each counter is read and bumped
in one ``UPDATE ... RETURNING`` and NewOrder locks its stock rows in key order (no deadlocks
between NewOrders), so the TPC-C consistency conditions hold under it. Delivery takes each
district's oldest new order with ``FOR UPDATE``, which waits for and skips one that a
concurrent Delivery took first. Each returns what dgcc's procedure gives its client (NewOrder
every line's item name, stock level and brand; Payment the customer's row and C_DATA head;
Order-Status the order's lines), so both systems read and ship the same data.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FUNCTIONS_SQL", "ROLLBACK_SQLSTATE", "create_functions"]

ROLLBACK_SQLSTATE = "DG001"

_DIST_CASE = " ".join(f"WHEN {d} THEN s_dist_{d:02d}" for d in range(1, 11))

FUNCTIONS_SQL = f"""
CREATE OR REPLACE FUNCTION dgcc_customer_id(p_w int, p_d int, p_c_id int, p_c_last text)
RETURNS int LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_count int;
    v_id int;
BEGIN
    IF p_c_last = '' THEN
        RETURN p_c_id;
    END IF;
    SELECT count(*) INTO v_count FROM customer
        WHERE c_w_id = p_w AND c_d_id = p_d AND c_last = p_c_last;
    IF v_count = 0 THEN
        RAISE EXCEPTION 'no customer named % in district (%, %)', p_c_last, p_w, p_d;
    END IF;
    SELECT c_id INTO v_id FROM customer
        WHERE c_w_id = p_w AND c_d_id = p_d AND c_last = p_c_last
        ORDER BY c_first, c_id OFFSET (v_count - 1) / 2 LIMIT 1;
    RETURN v_id;
END $$;

DROP FUNCTION IF EXISTS new_order(int, int, int, int[], int[], int[], bigint);
CREATE FUNCTION new_order(
    p_w int, p_d int, p_c int, p_items int[], p_supply int[], p_qty int[], p_entry bigint,
    OUT r_o_id int, OUT r_total_cents bigint, OUT r_c_last text, OUT r_c_credit text,
    OUT r_lines jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_w_tax int;
    v_d_tax int;
    v_discount int;
    v_sum bigint := 0;
    v_prices int[];
    v_names text[];
    v_data text[];
    v_levels int[] := '{{}}';
    v_brands text[] := '{{}}';
    v_price int;
    v_dist char(24);
    v_quantity int;
    v_s_data text;
    v_line record;
    v_bad int;
BEGIN
    -- every line's item in one probe of ITEM; a missing item (NULL) rolls back before writes
    SELECT array_agg(i.i_price ORDER BY u.n), array_agg(i.i_name ORDER BY u.n),
           array_agg(i.i_data ORDER BY u.n)
        INTO v_prices, v_names, v_data
        FROM unnest(p_items) WITH ORDINALITY AS u(id, n) LEFT JOIN item AS i ON i.i_id = u.id;
    v_bad := array_position(v_prices, NULL);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'invalid item id %', p_items[v_bad] USING ERRCODE = '{ROLLBACK_SQLSTATE}';
    END IF;
    SELECT w_tax INTO v_w_tax FROM warehouse WHERE w_id = p_w;
    UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = p_w AND d_id = p_d
        RETURNING d_next_o_id - 1, d_tax INTO r_o_id, v_d_tax;
    SELECT c_discount, c_last, c_credit INTO v_discount, r_c_last, r_c_credit FROM customer
        WHERE c_w_id = p_w AND c_d_id = p_d AND c_id = p_c;
    INSERT INTO orders VALUES (r_o_id, p_d, p_w, p_c, p_entry, NULL, cardinality(p_items),
        (SELECT CASE WHEN bool_and(s = p_w) THEN 1 ELSE 0 END FROM unnest(p_supply) AS s));
    INSERT INTO new_order VALUES (r_o_id, p_d, p_w);
    FOR v_line IN
        SELECT u.i, u.w, u.q, u.n FROM unnest(p_items, p_supply, p_qty)
            WITH ORDINALITY AS u(i, w, q, n)
        ORDER BY u.w, u.i, u.n  -- stock rows in key order: no NewOrder deadlocks
    LOOP
        UPDATE stock SET
            s_quantity = CASE WHEN s_quantity - v_line.q >= 10 THEN s_quantity - v_line.q
                              ELSE s_quantity - v_line.q + 91 END,
            s_ytd = s_ytd + v_line.q,
            s_order_cnt = s_order_cnt + 1,
            s_remote_cnt = s_remote_cnt + (v_line.w <> p_w)::int
        WHERE s_w_id = v_line.w AND s_i_id = v_line.i
        RETURNING CASE p_d {_DIST_CASE} END, s_quantity, s_data
            INTO v_dist, v_quantity, v_s_data;
        v_price := v_prices[v_line.n];
        INSERT INTO order_line VALUES (r_o_id, p_d, p_w, v_line.n, v_line.i, v_line.w, NULL,
            v_line.q, v_line.q * v_price, v_dist);
        v_sum := v_sum + v_line.q * v_price;
        v_levels[v_line.n] := v_quantity;  -- the stock level this line left
        v_brands[v_line.n] := CASE WHEN strpos(v_data[v_line.n], 'ORIGINAL') > 0
            AND strpos(v_s_data, 'ORIGINAL') > 0 THEN 'B' ELSE 'G' END;
    END LOOP;
    r_total_cents := (v_sum * (10000 - v_discount) * (10000 + v_w_tax + v_d_tax) + 50000000)
        / 100000000;
    -- the terminal's lines: supply warehouse, item, name, quantity, stock, brand, price, amount
    SELECT jsonb_agg(jsonb_build_array(p_supply[n], p_items[n], v_names[n], p_qty[n],
                                       v_levels[n], v_brands[n], v_prices[n],
                                       p_qty[n] * v_prices[n]) ORDER BY n)
        INTO r_lines FROM generate_subscripts(p_items, 1) AS n;
END $$;

DROP FUNCTION IF EXISTS payment(int, int, int, int, int, text, bigint, bigint);
CREATE FUNCTION payment(
    p_w int, p_d int, p_c_w int, p_c_d int, p_c_id int, p_c_last text, p_amount bigint,
    p_date bigint, OUT r_c_id int, OUT r_balance bigint, OUT r_customer jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_w_name text;
    v_d_name text;
BEGIN
    UPDATE warehouse SET w_ytd = w_ytd + p_amount WHERE w_id = p_w RETURNING w_name INTO v_w_name;
    UPDATE district SET d_ytd = d_ytd + p_amount WHERE d_w_id = p_w AND d_id = p_d
        RETURNING d_name INTO v_d_name;
    r_c_id := dgcc_customer_id(p_c_w, p_c_d, p_c_id, p_c_last);
    UPDATE customer SET
        c_balance = c_balance - p_amount,
        c_ytd_payment = c_ytd_payment + p_amount,
        c_payment_cnt = c_payment_cnt + 1,
        c_data = CASE WHEN c_credit = 'BC' THEN substr(format('%s %s %s %s %s %s|', r_c_id,
            p_c_d, p_c_w, p_d, p_w, p_amount) || c_data, 1, 500) ELSE c_data END
    WHERE c_w_id = p_c_w AND c_d_id = p_c_d AND c_id = r_c_id
    RETURNING c_balance, jsonb_build_array(c_first, c_middle, c_last, c_since, c_credit,
        c_credit_lim, c_discount, CASE WHEN c_credit = 'BC' THEN substr(c_data, 1, 200)
        ELSE '' END)
        INTO r_balance, r_customer;
    INSERT INTO history VALUES (r_c_id, p_c_d, p_c_w, p_d, p_w, p_date, p_amount,
        v_w_name || '    ' || v_d_name);
END $$;

DROP FUNCTION IF EXISTS order_status(int, int, int, text);
CREATE FUNCTION order_status(
    p_w int, p_d int, p_c_id int, p_c_last text,
    OUT r_c_id int, OUT r_c_first text, OUT r_c_middle text, OUT r_c_last text,
    OUT r_balance bigint, OUT r_o_id int, OUT r_entry_d bigint, OUT r_carrier_id int,
    OUT r_lines jsonb)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    r_c_id := dgcc_customer_id(p_w, p_d, p_c_id, p_c_last);
    SELECT c_first, c_middle, c_last, c_balance INTO r_c_first, r_c_middle, r_c_last, r_balance
        FROM customer WHERE c_w_id = p_w AND c_d_id = p_d AND c_id = r_c_id;
    SELECT o_id, o_entry_d, o_carrier_id INTO r_o_id, r_entry_d, r_carrier_id FROM orders
        WHERE o_w_id = p_w AND o_d_id = p_d AND o_c_id = r_c_id ORDER BY o_id DESC LIMIT 1;
    -- the order's lines: supply warehouse, item, quantity, amount, delivery date
    SELECT coalesce(jsonb_agg(jsonb_build_array(ol_supply_w_id, ol_i_id, ol_quantity,
                                                ol_amount, ol_delivery_d) ORDER BY ol_number),
                    '[]'::jsonb)
        INTO r_lines FROM order_line
        WHERE ol_w_id = p_w AND ol_d_id = p_d AND ol_o_id = r_o_id;
END $$;

CREATE OR REPLACE FUNCTION delivery(p_w int, p_carrier int, p_date bigint, OUT r_o_ids int[])
LANGUAGE plpgsql AS $$
DECLARE
    v_o int;
    v_c int;
    v_total bigint;
BEGIN
    r_o_ids := '{{}}';
    FOR v_d IN 1..10 LOOP
        v_o := NULL;
        SELECT no_o_id INTO v_o FROM new_order WHERE no_w_id = p_w AND no_d_id = v_d
            ORDER BY no_o_id LIMIT 1 FOR UPDATE;
        IF v_o IS NULL THEN
            r_o_ids := r_o_ids || 0;  -- nothing to deliver in this district: skipped
            CONTINUE;
        END IF;
        DELETE FROM new_order WHERE no_w_id = p_w AND no_d_id = v_d AND no_o_id = v_o;
        UPDATE orders SET o_carrier_id = p_carrier
            WHERE o_w_id = p_w AND o_d_id = v_d AND o_id = v_o RETURNING o_c_id INTO v_c;
        WITH lines AS (
            UPDATE order_line SET ol_delivery_d = p_date
            WHERE ol_w_id = p_w AND ol_d_id = v_d AND ol_o_id = v_o RETURNING ol_amount)
        SELECT sum(ol_amount) INTO v_total FROM lines;
        UPDATE customer SET c_balance = c_balance + v_total, c_delivery_cnt = c_delivery_cnt + 1
            WHERE c_w_id = p_w AND c_d_id = v_d AND c_id = v_c;
        r_o_ids := r_o_ids || v_o;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION stock_level(p_w int, p_d int, p_threshold int, OUT r_low int)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_next int;
BEGIN
    SELECT d_next_o_id INTO v_next FROM district WHERE d_w_id = p_w AND d_id = p_d;
    SELECT count(DISTINCT s_i_id) INTO r_low
        FROM order_line JOIN stock ON s_w_id = p_w AND s_i_id = ol_i_id
        WHERE ol_w_id = p_w AND ol_d_id = p_d AND ol_o_id >= greatest(1, v_next - 20)
          AND ol_o_id < v_next AND s_quantity < p_threshold;
END $$;
"""


def create_functions(connection: Any) -> None:
    """Create (or replace) the five transaction functions in ``connection``'s database."""
    with connection.cursor() as cursor:
        cursor.execute(FUNCTIONS_SQL)
