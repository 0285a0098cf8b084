#!/bin/bash
# Group membership + group ownership + setgid on directories (new files inherit the group).
usermod -aG web deploy
id deploy
chgrp -R web /srv/uploads
chmod -R g+rwX,o-w /srv/uploads
find /srv/uploads -type d -exec chmod g+s {} +
ls -laR /srv/uploads
