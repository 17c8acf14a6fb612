-- Argo CD health of a torchyard.dev ModelVersion. The operator creates a ModelVersion
-- only after the registry service published the version (files renamed into place,
-- sha256 of every file recorded), so one that exists is Healthy; an Available condition
-- in status.conditions, when present, decides instead (False: Degraded).
local hs = {}

if obj.status ~= nil and obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Available" then
      if c.status == "True" then
        hs.status = "Healthy"
      elseif c.status == "False" then
        hs.status = "Degraded"
      else
        hs.status = "Progressing"
      end
      hs.message = c.message or c.reason or ""
      return hs
    end
  end
end

hs.status = "Healthy"
local spec = obj.spec or {}
local files = 0
if spec.files ~= nil then
  files = #spec.files
end
hs.message = "Model " .. tostring(spec.model) .. " version " .. tostring(spec.version)
    .. " (" .. tostring(spec.size or "?") .. ", " .. files .. " file(s))"
return hs
