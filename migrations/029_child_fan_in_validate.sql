-- poimen:no-transaction
-- The constraint 028 replaced NOT VALID, checked without stopping writes
-- (VALIDATE takes a SHARE UPDATE EXCLUSIVE lock). May run again.
alter table runs validate constraint runs_waiting_for;
