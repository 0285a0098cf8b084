#!/bin/bash
# --csv handles the quoted names with commas; --skip 1 drops the header since the table already exists.
cd /app
head -3 /data/customers.csv
sqlite3 /app/shop.db ".import --csv --skip 1 /data/customers.csv customers"
sqlite3 /app/shop.db "SELECT count(*), typeof(balance) FROM customers GROUP BY 2;"
sqlite3 /app/shop.db "SELECT printf('%.2f', sum(balance)) FROM customers;" > /app/total.txt
cat /app/total.txt
