#!/bin/bash
# The recent commits are in shop.db-wal: let SQLite itself write the copy (VACUUM INTO reads db + WAL and
# writes a rollback-journal database).
cd /srv/backup
ls -la /var/lib/shop/
sqlite3 /srv/backup/shop.db "SELECT count(*) FROM orders;"
sqlite3 /var/lib/shop/shop.db "SELECT count(*) FROM orders;"
rm -f /srv/backup/shop.db.new
sqlite3 /var/lib/shop/shop.db "VACUUM INTO '/srv/backup/shop.db.new';"
mv /srv/backup/shop.db.new /srv/backup/shop.db
rm -f /srv/backup/shop.db-wal /srv/backup/shop.db-shm
sqlite3 /srv/backup/shop.db "PRAGMA journal_mode; PRAGMA integrity_check; SELECT count(*) FROM orders;"
ls -la /srv/backup
